"""The adaptive verify policy's host time per step: AdaptiveVerify.choose and .observe alone.

    python -m tools.bench.policy [--requests 256] [--partitions 4] [--steps 400] [--repeats 3]
                                 [--cold] [--json FILE]

Drives the policy the way the scheduler does at the production tile (256 decode requests
x 8 rows over 4 partitions by default): each step choose() over confidences that vary per
step (half the requests sampled, one in ten with drafts still in flight), then observe()
of a StepFeedback with every verified window's acceptance, so the cost table takes a new
sample every step (its steady state). The start-up profile is a pinned cost under which
drafting pays (the policy solves every step); --cold starts without one (probes). Prints
the median and p90 of choose, observe and their sum over the steps after the first 50,
per run, and the median of the runs, in thread CPU time (a shared machine swings wall time
2x; the policy's own work does not). Run it beside another checkout (PYTHONPATH) to compare.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.engine.verify.cost_table import CostTable
from dspark_loop.engine.verify.policy import StepFeedback
from tools.bench import harness

K = DSPARK_K
WARMUP = 50  # steps left out of the figures (the table's first samples, the first solves)
VARIANTS = 16  # distinct inputs cycled through (precomputed: the benchmark times the policy only)


def pinned_cost(requests: int, rows: int, drafting: bool) -> float:
    """Rows nearly free and a drafter pass that pays: the policy drafts and solves every step."""
    return 0.02 + 2e-6 * rows + 1e-6 * requests + (1e-6 * requests + 0.001) * drafting


def inputs(R: int, P: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(VARIANTS):
        conf = rng.uniform(0.3, 1.0, (R, K)).astype(np.float32)
        conf[rng.random(R) < 0.1] = np.nan  # planned ahead: drafts in flight
        accepted = rng.integers(0, K + 1, R)
        out.append({"conf": conf, "accepted": accepted})
    return out


def run(R: int, P: int, steps: int, cold: bool) -> dict[str, float]:
    policy = AdaptiveVerify(None if cold else CostTable.profile(pinned_cost, -(-R // P)))
    part = np.repeat(np.arange(P), -(-R // P))[:R].astype(np.int32)
    cap = np.full(R, K, np.int32)
    sampled = np.arange(R) % 2 == 1
    constrained = np.zeros(R, bool)
    prompt = np.zeros(P, np.int64)
    cls = sampled.astype(np.int64)
    n = np.bincount(part, minlength=P)
    data = inputs(R, P)
    choose_s, observe_s = [], []
    for s in range(steps):
        d = data[s % VARIANTS]
        t0 = time.thread_time()
        ch = policy.choose(d["conf"], cap, part, sampled, constrained, prompt)
        t1 = time.thread_time()
        lens = ch.verify_len
        v = lens > 0
        acc = np.minimum(lens, d["accepted"])
        drafts = np.bincount(part, weights=lens, minlength=P).astype(np.int64)
        drafted = np.bincount(part, weights=ch.draft_next, minlength=P) > 0
        step_s = max(pinned_cost(int(n[p]), int(n[p] + drafts[p]), bool(drafted[p])) for p in range(P))
        windows = (ch.raw_survival[v], lens[v], acc[v], cls[v]) if v.any() and ch.raw_survival is not None else None
        fb = StepFeedback(n, drafts, prompt, drafted, step_s, int(R + acc.sum()), windows)
        t2 = time.thread_time()
        policy.observe(fb)
        t3 = time.thread_time()
        if s >= WARMUP:
            choose_s.append(t1 - t0)
            observe_s.append(t3 - t2)
    total = [a + b for a, b in zip(choose_s, observe_s)]

    def ms(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3

    return {
        "choose_ms": ms(choose_s, 0.5),
        "observe_ms": ms(observe_s, 0.5),
        "total_ms": ms(total, 0.5),
        "total_p90_ms": ms(total, 0.9),
    }


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser("policy", __doc__, with_model=False, json=True)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="no start-up profile: the table is measured by probes")
    args = ap.parse_args(argv)
    runs = []
    for _ in range(args.repeats):
        r = run(args.requests, args.partitions, args.steps, args.cold)
        runs.append(r)
        print(f"{args.requests} req x {args.partitions} partitions: " + " ".join(f"{k} {v:.3f}" for k, v in r.items()))
    out = {k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0]}
    print("median of runs: " + " ".join(f"{k} {v:.3f}" for k, v in out.items()))
    harness.report(args, out)


if __name__ == "__main__":
    main()
