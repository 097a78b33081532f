"""Benchmark the served system on a tiny random checkpoint, beside transformers' generate().

    python -m tools.bench.served [--max-tokens 64] [--prompt-len 32] [--streams 32]
        [--startup 1,4,16] [--serve 1,4] [--no-transformers] [--model DIR]

(The goal table of mixed requests beside transformers: python -m tools.bench.mixed.)

Measures, in one run and printed as one table (no pass/fail anywhere):
  - startup: seconds from `python -m dspark_loop` to /health 200, per rank count;
  - serving (greedy, ignore_eos, fixed prompt length): output tokens/s and time to first
    token with 1 stream and with N concurrent streams, per rank count;
  - transformers DeepseekV4ForCausalLM.generate() (fp32, greedy) on the same checkpoint:
    tokens/s single stream and batched N (equal prompt lengths, so no padding);
  - ratios served / transformers.
Rank counts map to topologies: 1 -> one rank, 4 -> dp2/tp2/ep4, 16 -> dp4/tp4/ep16
(override with --topology N="--dp .. --tp .. --ep .."). Runs from a repository checkout
(it uses the e2e harness in tests/e2e: run it with
`python -m` from the repository root, which puts the root on the import path).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

from tools.bench import harness
from tools.bench.prompts import prompt_ids

TOPOLOGIES = {
    1: [],
    2: ["--tp", "2", "--ep", "2"],
    4: ["--dp", "2", "--tp", "2", "--ep", "4"],
    8: ["--dp", "2", "--tp", "4", "--ep", "8"],
    16: ["--dp", "4", "--tp", "4", "--ep", "16"],
}


async def serve_round(url: str, prompts: list[list[int]], max_tokens: int) -> dict:
    """All prompts streamed at once: output tokens/s over the wall time, TTFTs."""
    import aiohttp

    from dspark_testing.stream_client import stream_completion

    bodies = [{"prompt": p, "max_tokens": max_tokens, "ignore_eos": True, "return_token_ids": True} for p in prompts]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(stream_completion(s, url, b) for b in bodies))
        wall = time.perf_counter() - t0
    for r in results:
        if r.errors or len(r.token_ids) != max_tokens:
            raise RuntimeError(f"a stream failed: {r.errors or r.finish_reason}")
    ttfts = [r.first_token_s for r in results]
    return {
        "tok_s": sum(len(r.token_ids) for r in results) / wall,
        "wall_s": wall,
        "ttft_s": statistics.mean(ttfts),
        "ttft_max_s": max(ttfts),
    }


def bench_server(ckpt: str, ranks: int, topology: list[str], args, vocab_size: int, serve: bool) -> dict:
    from dspark_testing.server_process import ServerProcess

    row: dict = {"ranks": ranks, "topology": " ".join(topology) or "1 rank"}
    server = ServerProcess(["--model", ckpt, "--log-level", "warning", *topology], timeout_s=900)
    try:
        row["startup_s"] = server.ready_s
        if serve:
            server.complete(prompt_ids(args.prompt_len, 999, vocab_size), 2)  # warm-up
            try:
                row["single"] = asyncio.run(
                    serve_round(server.url, [prompt_ids(args.prompt_len, 0, vocab_size)], args.max_tokens)
                )
                row["batch"] = asyncio.run(
                    serve_round(
                        server.url,
                        [prompt_ids(args.prompt_len, i, vocab_size) for i in range(args.streams)],
                        args.max_tokens,
                    )
                )
            except Exception as e:  # noqa: BLE001 -- a benchmark reports, it does not stop
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        server.stop()
    return row


def bench_transformers(ckpt: str, args, vocab_size: int) -> dict:
    from dspark_testing.greedy_reference import GreedyReference

    ref = GreedyReference(ckpt)
    one = prompt_ids(args.prompt_len, 0, vocab_size)
    ref.generate_batch([one], 2)  # warm-up
    t0 = time.perf_counter()
    ref.generate_batch([one], 1)
    ttft = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref.generate_batch([one], args.max_tokens)
    single = args.max_tokens / (time.perf_counter() - t0)
    batch = [prompt_ids(args.prompt_len, i, vocab_size) for i in range(args.streams)]
    t0 = time.perf_counter()
    ref.generate_batch(batch, 1)
    batch_ttft = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref.generate_batch(batch, args.max_tokens)
    batched = args.streams * args.max_tokens / (time.perf_counter() - t0)
    return {"single": {"tok_s": single, "ttft_s": ttft}, "batch": {"tok_s": batched, "ttft_s": batch_ttft}}


def print_table(rows: list[dict], hf: dict | None, args) -> None:
    n = args.streams
    flat = []
    for r in rows:
        s, b = r.get("single", {}), r.get("batch", {})
        name = f"served, {r['ranks']} rank(s) ({r['topology']})"
        if "error" in r:
            name += f" -- serving failed: {r['error']}"
        flat.append(
            {"system": name, "startup_s": r.get("startup_s"), "s_tok": s.get("tok_s"), "s_ttft": s.get("ttft_s")}
            | {"b_tok": b.get("tok_s"), "b_ttft": b.get("ttft_s")}
        )
    if hf:
        s, b = hf["single"], hf["batch"]
        flat.append(
            {"system": "transformers generate() fp32", "s_tok": s["tok_s"], "s_ttft": s["ttft_s"]}
            | {"b_tok": b["tok_s"], "b_ttft": b["ttft_s"]}
        )
    harness.table(
        flat,
        [
            ("system", "system", ""),
            ("startup s", "startup_s", ".2f"),
            ("1-stream tok/s", "s_tok", ".2f"),
            ("TTFT s", "s_ttft", ".3f"),
            (f"{n}-stream tok/s", "b_tok", ".2f"),
            ("mean TTFT s", "b_ttft", ".3f"),
        ],
        title=f"\ntiny checkpoint, prompt {args.prompt_len} ids, {args.max_tokens} new tokens, greedy, "
        f"{os.cpu_count()} CPUs\n",
    )
    if hf:
        print("\nratios served / transformers (tokens/s):")
        for r in rows:
            if "single" in r and "batch" in r:
                print(
                    f"  {r['ranks']:>2} rank(s): 1-stream x{r['single']['tok_s'] / hf['single']['tok_s']:.2f}"
                    f"   {n}-stream x{r['batch']['tok_s'] / hf['batch']['tok_s']:.2f}"
                )
    print()


def rank_list(text: str) -> list[int]:
    ranks = [int(x) for x in text.split(",") if x.strip()]
    bad = [r for r in ranks if r not in TOPOLOGIES]
    if bad:
        raise argparse.ArgumentTypeError(f"rank counts must be among {sorted(TOPOLOGIES)} (got {bad})")
    return ranks


def topology_override(text: str) -> tuple[int, list[str]]:
    ranks, sep, flags = text.partition("=")
    if not sep or not ranks.strip().isdigit():
        raise argparse.ArgumentTypeError(f'must look like 4="--dp 1 --tp 4 --ep 4" (got {text!r})')
    return int(ranks), flags.split()


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser("served", __doc__)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--streams", type=int, default=32, help="concurrent streams in the batched round")
    ap.add_argument("--startup", type=rank_list, default=[1, 4, 16], help="rank counts to start")
    ap.add_argument("--serve", type=rank_list, default=[1, 4], help="rank counts to serve with")
    ap.add_argument(
        "--topology",
        type=topology_override,
        action="append",
        default=[],
        metavar='N="FLAGS"',
        help="the flags for N ranks",
    )
    ap.add_argument("--no-transformers", action="store_true")
    args = ap.parse_args(argv)
    topologies = {**TOPOLOGIES, **dict(args.topology)}
    with tempfile.TemporaryDirectory(prefix="dspark-bench-") as tmp:
        ckpt = args.model or harness.tiny_checkpoint(tmp)
        from dspark_loop.contract.model_config import ModelConfig

        vocab_size = ModelConfig.from_dir(ckpt).vocab_size
        rows = []
        for ranks in sorted(set(args.startup) | set(args.serve)):
            print(f"... {ranks} rank(s): {' '.join(topologies[ranks]) or 'one rank'}", flush=True)
            rows.append(bench_server(ckpt, ranks, topologies[ranks], args, vocab_size, serve=ranks in args.serve))
        hf = None
        if not args.no_transformers:
            print("... transformers generate()", flush=True)
            hf = bench_transformers(ckpt, args, vocab_size)
    print_table(rows, hf, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
