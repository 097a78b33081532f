"""How long a lost rank takes the server down, and what it costs: kill (or freeze) one rank
while requests run and wait, and time the recovery.

    python -m tools.bench.recovery [--model DIR] [--topology "--dp 2 --tp 2 --ep 4"]
                                   [--signal SIGKILL|SIGSTOP] [--rounds 3] [--running 2] [--waiting 2]

Per round: `running` long streams and `waiting` short requests (--max-num-seqs = running,
so the short ones wait; running >= dp), then the signal to the last rank. Reported per round:
    errors_s     signal -> every running stream has ended with its error event
    serving_s    signal -> /health 200 again (fresh ranks, weights reloaded)
    lost         requests that ended with an error (must equal `running`)
    kept_ok      waiting requests that finished with their solo tokens
    restart_s    the server's own figure (death noticed -> serving), from /metrics/json
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time

import aiohttp

from tools.bench import harness


async def one_round(server, sig: int, running: int, waiting: int, seed: int) -> dict:
    from dspark_testing.prompts import token_prompt

    short = [token_prompt(16 + i, seed=seed + i) for i in range(waiting)]
    solo = [server.complete(p, 16)["choices"][0]["token_ids"] for p in short]
    # the long requests fill the context after their 8-token prompts (a larger max_tokens is a 400)
    room = json.loads(server.get("/v1/models")[1])["data"][0]["max_model_len"] - 8
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def stream(body) -> tuple[bool, list[int]]:
            async with http.post(server.url + "/v1/completions", json={**body, "stream": True}) as r:
                if r.status != 200:
                    return False, []
                tokens, ok = [], True
                async for raw in r.content:
                    line = raw.decode().strip()
                    if line.startswith("data: {"):
                        event = json.loads(line[6:])
                        ok = ok and "error" not in event
                        tokens += [t for c in event.get("choices", []) for t in c.get("token_ids", [])]
                return ok, tokens

        long_tasks = [
            asyncio.create_task(
                stream({"prompt": token_prompt(8, seed=seed + 100 + i), "max_tokens": room, "ignore_eos": True})
            )
            for i in range(running)
        ]
        while sum(p["num_running"] for p in server.engine_stats()["partitions"]) < running:
            await asyncio.sleep(0.05)
        short_tasks = [
            asyncio.create_task(stream({"prompt": p, "max_tokens": 16, "ignore_eos": True, "return_token_ids": True}))
            for p in short
        ]
        while sum(p["num_waiting"] for p in server.engine_stats()["partitions"]) < waiting:
            await asyncio.sleep(0.05)
        before = server.metrics_json()["mesh_restarts_total"]
        os.kill(server.rank_pids()[-1], sig)
        t0 = time.monotonic()
        long_results = await asyncio.gather(*long_tasks)
        errors_s = time.monotonic() - t0
        while server.get("/health")[0] != 200 or server.metrics_json()["mesh_restarts_total"] == before:
            await asyncio.sleep(0.02)
        serving_s = time.monotonic() - t0
        short_results = await asyncio.gather(*short_tasks)
    lost = sum(not ok for ok, _ in long_results) + sum(not ok for ok, _ in short_results)
    kept_ok = sum(ok and tokens == want for (ok, tokens), want in zip(short_results, solo))
    return {"errors_s": errors_s, "serving_s": serving_s, "lost": lost, "kept_ok": kept_ok}


def main(argv: list[str] | None = None) -> int:
    p = harness.parser("recovery", __doc__)
    p.add_argument("--topology", default="", help='e.g. "--dp 2 --tp 2 --ep 4" (default 1 rank)')
    p.add_argument("--signal", default="SIGKILL", choices=["SIGKILL", "SIGSTOP"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--running", type=int, default=1, help="long streams at the death")
    p.add_argument("--waiting", type=int, default=2, help="requests queued at the death")
    args = p.parse_args(argv)
    from dspark_testing.server_process import ServerProcess

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.model or harness.tiny_checkpoint(tmp, seed=7)
        server = ServerProcess(
            [
                "--model",
                ckpt,
                "--log-level",
                "warning",
                *args.topology.split(),
                "--max-num-seqs",
                str(args.running),
                "--max-rank-restarts",
                str(args.rounds),
            ],
            timeout_s=900,
        )
        try:
            rows = [
                asyncio.run(one_round(server, getattr(signal, args.signal), args.running, args.waiting, seed=10 * r))
                for r in range(args.rounds)
            ]
            restart_s = [line for line in server.log().splitlines() if "rank mesh restarted in" in line]
        finally:
            server.stop()
    topo = args.topology or "1 rank"
    for r, row in enumerate(rows):
        print(
            f"[{topo}] {args.signal} round {r}: errors after {row['errors_s']:.2f} s, serving "
            f"after {row['serving_s']:.2f} s, lost {row['lost']} (running {args.running}), "
            f"kept and correct {row['kept_ok']}/{args.waiting}"
        )
    print(
        f"[{topo}] {args.signal} median serving again after "
        f"{statistics.median(r['serving_s'] for r in rows):.2f} s, errors after "
        f"{statistics.median(r['errors_s'] for r in rows):.2f} s; server's own lines:"
    )
    for line in restart_s:
        print("   ", line.split("WARNING ", 1)[-1])
    ok = all(r["lost"] == args.running and r["kept_ok"] == args.waiting for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
