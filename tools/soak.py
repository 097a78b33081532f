"""Soak: N concurrent streams for T seconds of mixed client behaviour against a real server,
at K=0 and K=7; every stream that completes must carry its prompt's solo greedy tokens,
and once it is over every page and drafter lease must be back.

    python -m tools.soak [--model DIR] [--topology "--dp 2 --tp 2 --ep 4"] [--streams 16]
                         [--seconds 60] [--k 0,7] [--seed 0] [--kill-rank-at S] [--json OUT]

Each client loops until the time is up, picking a prompt (lengths 1..~200), a max_tokens
and a behaviour:
    read      reads every event
    slow      sleeps 5-50 ms between reads (the server must not care)
    leave     reads a random number of events, then drops the connection
    abort     drops the connection right after sending (before or around the first token)
Solo tokens: each prompt served alone (non-stream) at its largest max_tokens after the
soak; a completed stream must equal that list's prefix. With no --model a tiny random
checkpoint with a drafter is made in a temporary directory. --topology takes any server flags
(e.g. "--backend sim --device-profile npu-tile --dp 4 --tp 4 --ep 16 --max-num-seqs 256").
--kill-rank-at S: SIGKILL the last rank S seconds in; the server restarts its ranks and the
streams in flight then end with an error (counted apart, as restart_errors: those that ended
after the kill and before the server was ready again plus a grace period). The server's RSS
is read after a warm-up and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import aiohttp
import numpy as np

BEHAVIOURS = (("read", 0.55), ("slow", 0.15), ("leave", 0.2), ("abort", 0.1))
MAX_TOKENS = (4, 16, 48)


@dataclass
class Report:
    k: int
    topology: str
    streams: int
    seconds: float
    requests: int = 0
    completed: int = 0
    tokens: int = 0
    by_behaviour: dict = field(default_factory=dict)
    disconnects: int = 0
    aborts: int = 0
    errors: int = 0  # error events or non-200 answers
    wrong_tokens: int = 0
    wrong_examples: list = field(default_factory=list)
    pools_full: bool = False
    leases_in_use: int = -1
    wall_s: float = 0.0
    restarts: int = 0  # mesh restarts the server counted
    restart_errors: int = 0  # error outcomes in the kill's window (--kill-rank-at)
    killed_rank: int = -1
    rss_mib_start: float = 0.0  # the server's resident memory after the warm-up
    rss_mib_end: float = 0.0

    @property
    def ok(self) -> bool:
        clean = self.wrong_tokens == 0 and self.errors == 0 and self.pools_full and self.leases_in_use == 0
        return clean and self.restarts == (1 if self.killed_rank >= 0 else 0)


def make_prompts(num: int, seed: int, vocab_size: int = 1024) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(2, vocab_size, size=1 + (i * 37) % 200)] for i in range(num)]


async def one_stream(
    http: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int, behaviour: str, rng: random.Random
) -> tuple[str, list[int] | None]:
    """(outcome, tokens if the stream completed): outcome completed|left|aborted|error."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "return_token_ids": True}
    if behaviour == "abort":
        task = asyncio.ensure_future(http.post(url + "/v1/completions", json=body))
        await asyncio.sleep(rng.uniform(0, 0.05))
        task.cancel()
        try:
            resp = await task
            resp.close()
        except (asyncio.CancelledError, aiohttp.ClientError):
            pass
        return "aborted", None
    leave_after = rng.randint(1, max(1, max_tokens // 2)) if behaviour == "leave" else None
    tokens: list[int] = []
    async with http.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            return "error", None
        seen = 0
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                return "completed", tokens
            event = json.loads(payload)
            if "error" in event:
                return "error", None
            tokens += [t for c in event["choices"] for t in c.get("token_ids", [])]
            seen += 1
            if leave_after is not None and seen >= leave_after:
                resp.close()
                return "left", None
            if behaviour == "slow":
                await asyncio.sleep(rng.uniform(0.005, 0.05))
    return "error", None


RESTART_GRACE_S = 5.0  # after the server is ready again, errors still count as the kill's


async def kill_rank_later(server, at_s: float, report: Report) -> tuple[float, float]:
    """SIGKILL the last rank at_s seconds in; (killed at, ready again at) in monotonic time."""
    await asyncio.sleep(at_s)
    pid = server.rank_pids()[-1]
    report.killed_rank = len(server.rank_pids()) - 1
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while True:
        await asyncio.sleep(0.2)
        status, _ = await asyncio.to_thread(server.get, "/health")
        if status == 200 and server.metrics_json().get("mesh_restarts_total", 0) >= 1:
            return killed, time.monotonic()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def soak(
    url: str,
    prompts: list[list[int]],
    streams: int,
    seconds: float,
    seed: int,
    report: Report,
    server=None,
    kill_at=None,
) -> list[tuple[int, int, list[int]]]:
    """Run the clients; the completed streams as (prompt index, max_tokens, tokens)."""
    done: list[tuple[int, int, list[int]]] = []
    counts: Counter = Counter()
    error_times: list[float] = []
    deadline = time.monotonic() + seconds
    killer = asyncio.ensure_future(kill_rank_later(server, kill_at, report)) if kill_at is not None else None
    names, weights = zip(*BEHAVIOURS)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def client(c: int) -> None:
            rng = random.Random(seed * 1000 + c)
            while time.monotonic() < deadline:
                i, m = rng.randrange(len(prompts)), rng.choice(MAX_TOKENS)
                behaviour = rng.choices(names, weights)[0]
                counts[behaviour] += 1
                try:
                    outcome, tokens = await one_stream(http, url, prompts[i], m, behaviour, rng)
                except aiohttp.ClientError:  # the connection dropped (a restart fails streams)
                    outcome, tokens = "error", None
                counts[outcome] += 1
                if outcome == "error":
                    error_times.append(time.monotonic())
                if tokens is not None:
                    done.append((i, m, tokens))

        await asyncio.gather(*(client(c) for c in range(streams)))
    if killer is not None:
        killed, ready = await killer
        window = [t for t in error_times if killed <= t <= ready + RESTART_GRACE_S]
        report.restart_errors = len(window)
        counts["error"] -= len(window)
    report.requests = sum(counts[b] for b in names)
    report.by_behaviour = {b: counts[b] for b in names}
    report.completed, report.errors = counts["completed"], counts["error"]
    report.disconnects, report.aborts = counts["left"], counts["aborted"]
    return done


def run_one(ckpt: str, k: int, topology: list[str], args) -> Report:
    from dspark_testing.server_process import ServerProcess, pools_full

    flags = ["--model", ckpt, "--log-level", "warning", *topology]
    if k:
        flags += ["--speculative-config", json.dumps({"method": "dspark", "num_speculative_tokens": k})]
    server = ServerProcess(flags, timeout_s=900)
    report = Report(k, " ".join(topology) or "1 rank", args.streams, args.seconds)
    prompts = make_prompts(args.prompts, args.seed)
    try:
        for i in range(len(prompts)):  # warm-up: every prompt once, then the RSS to compare with
            server.complete(prompts[i], 4)
        report.rss_mib_start = rss_mib(server.pid)
        t0 = time.monotonic()
        done = asyncio.run(
            soak(server.url, prompts, args.streams, args.seconds, args.seed, report, server, args.kill_rank_at)
        )
        report.wall_s = time.monotonic() - t0
        stats = server.wait_idle(60)
        report.restarts = server.metrics_json().get("mesh_restarts_total", 0)
        report.rss_mib_end = rss_mib(server.pid)
        report.pools_full = pools_full(stats)
        report.leases_in_use = stats["dspark"]["leases_in_use"]
        longest = {i: max(m for j, m, _ in done if j == i) for i in {j for j, _, _ in done}}
        solo = {i: server.complete(prompts[i], m)["choices"][0]["token_ids"] for i, m in longest.items()}
        for i, m, tokens in done:
            report.tokens += len(tokens)
            if tokens != solo[i][:m]:
                report.wrong_tokens += 1
                if len(report.wrong_examples) < 5:
                    report.wrong_examples.append({"prompt": i, "max_tokens": m, "got": tokens, "solo": solo[i][:m]})
    finally:
        code = server.stop()
    if code != 0:
        print(f"server exited with {code}:\n{server.log()[-3000:]}", file=sys.stderr)
    return report


def print_report(r: Report) -> None:
    print(
        f"K={r.k} [{r.topology}] {r.streams} streams x {r.seconds:g} s (wall {r.wall_s:.1f} s): "
        f"{r.requests} requests {r.by_behaviour}; completed {r.completed} ({r.tokens} tokens, "
        f"{r.tokens / max(r.wall_s, 1e-9):.1f} tok/s), disconnects {r.disconnects}, "
        f"aborts {r.aborts}, errors {r.errors}, wrong tokens {r.wrong_tokens}; pools full "
        f"{r.pools_full}, leases in use {r.leases_in_use}; restarts {r.restarts} (rank {r.killed_rank} "
        f"killed: {r.restart_errors} requests failed or refused while it restarted); "
        f"server RSS {r.rss_mib_start:.0f} -> {r.rss_mib_end:.0f} MiB -> {'OK' if r.ok else 'FAIL'}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="checkpoint with a drafter (default: a tiny one)")
    p.add_argument("--topology", default="", help='e.g. "--dp 2 --tp 2 --ep 4" (default 1 rank)')
    p.add_argument("--streams", type=int, default=16, help="concurrent clients")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--prompts", type=int, default=12, help="distinct prompts")
    p.add_argument("--k", default="0,7", help="comma-separated K values to soak")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the reports here")
    p.add_argument("--kill-rank-at", type=float, default=None, help="SIGKILL the last rank this many seconds in")
    args = p.parse_args(argv)
    ks = [int(k) for k in args.k.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.model
        if ckpt is None:
            from tools.make_checkpoint import make_checkpoint

            ckpt = make_checkpoint(os.path.join(tmp, "tiny"), size="tiny", seed=7, with_drafter=True, quiet=True)
        reports = [run_one(ckpt, k, args.topology.split(), args) for k in ks]
    for r in reports:
        print_report(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**asdict(r), "ok": r.ok} for r in reports], f, indent=1)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
