"""The served system's goals in one table, beside transformers in the same run.

    python -m tools.bench.mixed [--mixed-requests 32] [--repeats 2] [--one-at-a-time-once]
        [--ref-threads N] [--max-tokens 64] [--prompt-len 32] [--model DIR]

  goal                      served                               transformers (fp32, same weights)
  1 stream                  tok/s of one greedy stream           cached greedy generate(), batch 1
  N mixed vs static batch   tok/s, N requests at once            left-padded static batch generate()
  N mixed vs one at a time  (prompts 16-512, outputs 16-128)     each request alone, one after another
  prefill 512               time to first token (max_tokens 1)   one forward of the same prompt

tok/s counts the tokens each request asked for (a static batch runs to its longest request;
its padding and surplus tokens do not count). Served and transformers rounds alternate and
each figure is the best of --repeats rounds (on a shared machine the best round is the least
disturbed one); --one-at-a-time-once runs the long one-request-at-a-time baseline in the
first round only. No pass/fail: ratios.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

import numpy as np

from tools.bench import harness
from tools.bench.prompts import prompt_ids

GOALS = {"1 stream": 1.5, "mixed vs static batch": 3.0, "mixed vs one at a time": 15.0, "prefill 512": 1.0}


def mixed_workload(n: int, vocab_size: int, seed: int = 14, round_: int = 0) -> tuple[list[list[int]], list[int]]:
    """n distinct prompts of 16-512 ids and their output lengths 16-128 (fixed by seed); the
    ids are fresh for each round_ (the same lengths), so no round hits the prefix cache."""
    rng = np.random.default_rng(seed)
    lens, outs = rng.integers(16, 513, n), rng.integers(16, 129, n)
    ids = np.random.default_rng([seed, round_])
    prompts = [ids.integers(2, vocab_size, int(k)).tolist() for k in lens]
    return prompts, [int(o) for o in outs]


async def _serve(url: str, prompts: list[list[int]], max_tokens: list[int]) -> dict:
    import aiohttp

    from dspark_testing.stream_client import stream_completion

    bodies = [
        {"prompt": p, "max_tokens": m, "ignore_eos": True, "return_token_ids": True}
        for p, m in zip(prompts, max_tokens)
    ]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(stream_completion(s, url, b) for b in bodies))
        wall = time.perf_counter() - t0
    for r, m in zip(results, max_tokens):
        if r.errors or len(r.token_ids) != m:
            raise RuntimeError(f"a stream failed: {r.errors or r.finish_reason}")
    return {"tok_s": sum(max_tokens) / wall, "wall_s": wall, "ttft_s": min(r.first_token_s for r in results)}


def best(runs: list[dict], key: str, lower: bool = False) -> dict:
    return (min if lower else max)(runs, key=lambda r: r[key])


class Reference:
    """transformers' DeepseekV4ForCausalLM on the same checkpoint: each goal's baseline."""

    def __init__(self, ckpt: str) -> None:
        from dspark_testing.greedy_reference import GreedyReference

        self.ref = GreedyReference(ckpt)

    def generate(self, batch: list[list[int]], num_new: int) -> float:
        import torch

        from dspark_testing.tie_rule import lowest_index_ties

        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])  # left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        t0 = time.perf_counter()
        with torch.no_grad(), lowest_index_ties():
            self.ref.model.generate(ids, attention_mask=mask, generation_config=self.ref.generation_config(num_new, 0))
        return time.perf_counter() - t0

    def forward(self, ids: list[int]) -> float:
        import torch

        t0 = time.perf_counter()
        with torch.no_grad():
            self.ref.model(torch.tensor([ids]))
        return time.perf_counter() - t0


def measure(ckpt: str, args, vocab_size: int) -> tuple[dict, dict]:
    """Served and transformers figures, alternating (served round, transformers round) x
    repeats so both sides see the same machine; the best round of each. Every round sends
    fresh prompts: a repeated prompt would hit the server's prefix cache."""
    from dspark_testing.server_process import ServerProcess

    ref = Reference(ckpt)
    ref.generate([prompt_ids(args.prompt_len, 999, vocab_size)], 2)  # warm-up
    served_runs: dict[str, list] = {"1 stream": [], "prefill 512": [], "mixed": []}
    ref_runs: dict[str, list] = {"1 stream": [], "prefill 512": [], "static": [], "one at a time": []}
    server = ServerProcess(["--model", ckpt, "--log-level", "warning"], timeout_s=900)
    try:
        server.complete(prompt_ids(args.prompt_len, 998, vocab_size), 2)  # warm-up
        for i in range(args.repeats):
            print(f"... round {i + 1}/{args.repeats}: served, then transformers", flush=True)
            one, long = prompt_ids(args.prompt_len, 1000 * i, vocab_size), prompt_ids(512, 1000 * i + 1, vocab_size)
            prompts, outs = mixed_workload(args.mixed_requests, vocab_size, round_=i)
            served_runs["1 stream"].append(asyncio.run(_serve(server.url, [one], [args.max_tokens])))
            ref_runs["1 stream"].append({"tok_s": args.max_tokens / ref.generate([one], args.max_tokens)})
            served_runs["prefill 512"].append(asyncio.run(_serve(server.url, [long], [1])))
            ref_runs["prefill 512"].append({"ttft_s": ref.forward(long)})
            served_runs["mixed"].append(asyncio.run(_serve(server.url, prompts, outs)))
            ref_runs["static"].append({"tok_s": sum(outs) / ref.generate(prompts, max(outs))})
            if i == 0 or not args.one_at_a_time_once:
                ref_runs["one at a time"].append(
                    {"tok_s": sum(outs) / sum(ref.generate([p], o) for p, o in zip(prompts, outs))}
                )
    finally:
        server.stop()
    lower = {"prefill 512"}
    served = {k: best(v, "ttft_s" if k in lower else "tok_s", k in lower) for k, v in served_runs.items()}
    refd = {k: best(v, "ttft_s" if k in lower else "tok_s", k in lower) for k, v in ref_runs.items()}
    return served, refd


def goal_rows(served: dict, ref: dict) -> list[tuple[str, str, str, float]]:
    """(goal, served figure, transformers figure, ratio; > 1 means served is faster)."""
    s1, r1 = served["1 stream"]["tok_s"], ref["1 stream"]["tok_s"]
    sm = served["mixed"]["tok_s"]
    sp, rp = served["prefill 512"]["ttft_s"], ref["prefill 512"]["ttft_s"]
    return [
        ("1 stream", f"{s1:.1f} tok/s", f"{r1:.1f} tok/s", s1 / r1),
        (
            "mixed vs static batch",
            f"{sm:.1f} tok/s",
            f"{ref['static']['tok_s']:.1f} tok/s",
            sm / ref["static"]["tok_s"],
        ),
        (
            "mixed vs one at a time",
            f"{sm:.1f} tok/s",
            f"{ref['one at a time']['tok_s']:.1f} tok/s",
            sm / ref["one at a time"]["tok_s"],
        ),
        ("prefill 512", f"{sp * 1e3:.1f} ms TTFT", f"{rp * 1e3:.1f} ms forward", rp / sp),
    ]


def run(ckpt: str, args, vocab_size: int) -> None:
    import torch

    served, ref = measure(ckpt, args, vocab_size)
    num_tokens = sum(mixed_workload(args.mixed_requests, vocab_size)[1])
    n = args.mixed_requests
    print(
        f"\n{n} mixed requests: prompts 16-512, outputs 16-128 ({num_tokens} tokens); 1 stream: prompt "
        f"{args.prompt_len}, {args.max_tokens} tokens; best of {args.repeats}; "
        f"{os.cpu_count()} CPUs; transformers on "
        f"{torch.get_num_threads()} thread(s)\n"
    )
    rows = [
        {"goal": g, "served": s, "transformers": r, "ratio": f"{ratio:.2f}x", "target": f"{GOALS[g]:.1f}x"}
        for g, s, r, ratio in goal_rows(served, ref)
    ]
    harness.table(rows, [(h, h, "") for h in ("goal", "served", "transformers", "ratio", "target")])
    print()


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser("mixed", __doc__)
    ap.add_argument("--max-tokens", type=int, default=64, help="the 1-stream figure's new tokens")
    ap.add_argument("--prompt-len", type=int, default=32, help="the 1-stream figure's prompt")
    ap.add_argument("--mixed-requests", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="best of N runs per figure")
    ap.add_argument(
        "--one-at-a-time-once", action="store_true", help="transformers one request at a time in the first round only"
    )
    ap.add_argument(
        "--ref-threads", type=int, default=None, help="torch threads for transformers (default: torch's, one per CPU)"
    )
    args = ap.parse_args(argv)
    if args.ref_threads is not None:
        import torch

        torch.set_num_threads(args.ref_threads)
    from dspark_loop.contract.model_config import ModelConfig

    with tempfile.TemporaryDirectory(prefix="dspark-bench-") as tmp:
        ckpt = args.model or harness.tiny_checkpoint(tmp)
        run(ckpt, args, ModelConfig.from_dir(ckpt).vocab_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
