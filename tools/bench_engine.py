"""Host cost of one engine step: schedule() + update() at steady-state decode.

    python -m tools.bench_engine [--requests 256] [--partitions 4] [--steps 300]

A fake leader answers every row with a fixed token (no ranks, no model), so the number is
pure scheduler + acceptance + detokenisation work. Two cases: K=0 (1 row per request) and
8 rows per request (K=7 verify with drafts that match up to a rotating position).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dspark_loop.contract.cache_layout import CacheLayout, Family
from dspark_loop.contract.protocol import StepResult, as_i32, i32
from dspark_loop.engine.detokenize import Detokenizer, TokenText
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.schedulers import make_scheduler
from dspark_testing.tiny_tokenizer import tiny_tokenizer


def flash_layout() -> CacheLayout:
    return CacheLayout(
        32,
        (Family(0, "swa", True, 32, 0, 128), Family(1, "c4", False, 128, 4, 0), Family(2, "c128", False, 128, 128, 0)),
    )


def fake_results(step) -> list[StepResult]:
    """Every row predicts its own input token + 1 (so drafts built the same way match)."""
    out = []
    for p, part in enumerate(step.plan.partitions):
        toks = [np.full(sum(1 for c in part.prefills if c.sample), 100, np.int32)]
        if part.decode is not None:
            toks.append((as_i32(part.decode.token_ids) % 500 + 3).astype(np.int32))
        out.append(StepResult(step.step_id, p, i32(np.concatenate(toks))))
    return out


def bench(num_requests: int, num_partitions: int, num_steps: int, spec_k: int, stop: list[str]):
    text = TokenText(tiny_tokenizer())
    sched = make_scheduler(
        layout=flash_layout(),
        num_partitions=num_partitions,
        num_blocks=[4096, 2048, 2048],
        max_num_seqs=num_requests,
        max_num_batched_tokens=8192,
        max_model_len=1 << 20,
        eos_token_ids=[1],
        spec_k=spec_k,
    )
    for i in range(num_requests):
        params = SamplingParams(max_tokens=1 << 19, stop=stop)
        g = GenerateRequest(f"r{i}", list(range(3, 3 + 64)), params)
        sched.add(sched.make_request(g, Detokenizer(text, params.stop)))
    times, k = [], 0
    for s in range(num_steps + 20):
        t0 = time.perf_counter()
        step = sched.schedule()
        sched.update(step, fake_results(step))
        dt = time.perf_counter() - t0
        if spec_k:  # drafts: right for the first (s % 8) tokens, the rest wrong
            for part in sched.partitions:
                for r in part.running:
                    if not r.is_prefilling:
                        d = np.empty(spec_k, np.int32)
                        prev = r.output_ids[-1]
                        for j in range(spec_k):
                            d[j] = prev % 500 + 3 if j < s % 8 else 2
                            prev = int(d[j])
                        sched.partitions[r.partition].set_drafts(r, d)
        if s >= 20:  # skip the prefill steps
            times.append(dt)
            k += step.num_new_tokens
    times.sort()
    return statistics.median(times), times[int(0.99 * (len(times) - 1))], k / len(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    for name, k, stop in (("K=0", 0, []), ("K=0 + stop strings", 0, ["STOP", "</end>"]), ("8 rows (K=7)", 7, [])):
        med, p99, toks = bench(args.requests, args.partitions, args.steps, k, stop)
        print(
            f"{name:20s} {args.requests} req x {args.partitions} partitions: "
            f"schedule+update median {med * 1e3:.3f} ms  p99 {p99 * 1e3:.3f} ms  "
            f"({toks:.0f} tokens/step)"
        )


if __name__ == "__main__":
    main()
