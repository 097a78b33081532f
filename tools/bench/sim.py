"""Drive a running server with N concurrent greedy streams and read its debug tap: per
steady decode step (every stream decoding, no prefill), the device time the ranks report
(StepTrace.device_busy_s: on --backend sim the profile's step time), the ranks' wall time
(compute_max_s) and the period between steps; the host's share is what the period adds.

    python -m dspark_loop ... --backend sim --debug-tap 5599 --port 8000 &
    python -m tools.bench.sim --url http://127.0.0.1:8000 --tap 5599 --streams 1 256

`--table FLASH_DIR` prints instead what each shipped profile's cost model gives a steady
decode step (no server): npu-tile and gpu-h200 at the seeds' 16 ranks (dp4/tp4) on a Flash
checkpoint, demo-cpu on the demo at 1 rank; every request at context CTX, greedy, K=7
drafting every request (tokens a step: requests x (1 + the sum of the greedy survivals)).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading

import aiohttp
import zmq

from dspark_loop.contract.protocol import TRACE_DECODER


def collect(addr: str, traces: list, stop: threading.Event) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 100)
    sock.connect(addr)
    while not stop.is_set():
        try:
            traces.append(TRACE_DECODER.decode(sock.recv()))
        except zmq.Again:
            continue
    sock.close()


async def streams(url: str, model: str, n: int, max_tokens: int) -> None:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one(i: int) -> None:
            async with http.post(f"{url}/v1/completions", json={**body, "prompt": f"Stream {i} says"}) as r:
                await r.read()

        await asyncio.gather(*(one(i) for i in range(n)))


def steady(traces: list, n: int) -> dict:
    """Medians over the steps where all n streams decode and nothing prefills."""
    full = [
        t
        for t in traces
        if sum(len(p.decode_req_ids) for p in t.partitions) == n and not any(p.prefill_req_ids for p in t.partitions)
    ]
    period = [b.wall_time - a.wall_time for a, b in zip(full, full[1:]) if b.step_id == a.step_id + 1]

    def ms(xs):
        return round(1e3 * statistics.median(xs), 3) if xs else None

    return {
        "streams": n,
        "steps": len(full),
        "device_ms": ms([t.device_busy_s for t in full]),
        "rank_wall_ms": ms([t.compute_max_s for t in full]),
        "period_ms": ms(period),
        "host_blocked_ms": ms([t.host_blocked_s for t in full]),
    }


def table(flash_dir: str, ctx: int, counts: list[int]) -> None:
    from dspark_loop.config.default_model import DEMO_DIR
    from dspark_loop.contract.model_config import ModelConfig
    from workers.sim.cost import CostModel, GroupLoad
    from workers.sim.profile import load_profile, shipped_profiles

    for name in shipped_profiles():
        p = load_profile(name)
        model_dir, world, tp = (DEMO_DIR, 1, 1) if name == "demo-cpu" else (flash_dir, 16, 4)
        model = ModelConfig.from_dir(model_dir)
        for k in (0, 7):
            cost = CostModel(p, model, world, tp, k)
            row = {"profile": name, "K": k}
            for n in counts:
                groups = [GroupLoad() for _ in range(world // tp)]
                for i in range(n):
                    g = groups[i % len(groups)]
                    g.decode_ctx.append(ctx)
                    g.decode_rows += 1 + k
                    g.anchors += bool(k)
                step = cost.step_seconds(groups)
                per_step = n * (1 + sum(p["acceptance.greedy"])) if k else n
                row[f"{n}"] = f"{1e3 * step:.2f} ms, {per_step / step:,.0f} tok/s"
            print(json.dumps(row))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.sim", description=__doc__)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--tap", default="5599", help="the server's --debug-tap (a bare port: loopback)")
    ap.add_argument("--model", default=None, help="served model name (default: the server's first)")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 256])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--table", metavar="FLASH_DIR", help="print the profiles' modelled step times instead")
    ap.add_argument("--ctx", type=int, default=512, help="--table: every request's context length")
    args = ap.parse_args(argv)
    if args.table:
        table(args.table, args.ctx, args.streams)
        return 0
    addr = f"tcp://127.0.0.1:{args.tap}" if args.tap.isdigit() else args.tap
    model = args.model
    if model is None:
        import urllib.request

        with urllib.request.urlopen(f"{args.url}/v1/models") as r:
            model = json.load(r)["data"][0]["id"]
    for n in args.streams:
        traces: list = []
        stop = threading.Event()
        reader = threading.Thread(target=collect, args=(addr, traces, stop), daemon=True)
        reader.start()
        asyncio.run(streams(args.url, model, n, args.max_tokens))
        stop.set()
        reader.join()
        print(json.dumps(steady(traces, n)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
