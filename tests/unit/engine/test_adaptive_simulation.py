"""The adaptive policy against K=0 and the fixed chain in a simulated engine: a known step
cost and drafts accepted with exactly their confidence, so expected tokens per second can
be computed without timing anything."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.adaptive_verify import AdaptiveVerify
from dspark_loop.engine.step_cost import StepCost

K = DSPARK_K
# demo-like costs (seconds): at 16 streams the drafter pass is ~60% of a K=0 step
COST = {"c0": 0.005, "c_row": 0.00025, "c_req": 0.00005, "c_draft": 0.00037}


def step_s(rows: int, requests: int, drafted: int) -> float:
    return COST["c0"] + COST["c_row"] * rows + COST["c_req"] * requests + COST["c_draft"] * drafted


def quality(R: int, mean: float, seed: int) -> np.ndarray:
    """Per-request per-draft acceptance, spread around mean (some requests are easy)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.beta(mean * 4, (1 - mean) * 4, R), 0.0, 0.99)


def k0_rate(R: int) -> float:
    return R / step_s(R, R, 0)


def fixed_rate(q: np.ndarray) -> float:
    R = len(q)
    tau = R + float((q[:, None] ** np.arange(1, K + 1)[None, :]).sum())
    return tau / step_s(8 * R, R, R)


def adaptive_rate(q: np.ndarray, steps: int = 200) -> tuple[float, float]:
    """(tokens per second, share of drafter passes skipped) of AdaptiveVerify run for
    `steps` steps; a skipped request has no drafts (cap 0) in the next step."""
    R = len(q)
    policy = AdaptiveVerify(StepCost(pinned=COST))
    has_drafts = np.ones(R, bool)
    conf = np.repeat(q[:, None], K, axis=1).astype(np.float32)  # [R, K]
    tokens = seconds = 0.0
    skipped = 0
    for _ in range(steps):
        cap = np.where(has_drafts, K, 0).astype(np.int32)
        choice = policy.choose(np.where(has_drafts[:, None], conf, 0.0), cap, np.zeros(R, np.int32))
        lens = choice.verify_len
        surv = q[:, None] ** np.arange(1, K + 1)[None, :]  # [R, K]
        got = R + float(surv[np.arange(K)[None, :] < lens[:, None]].sum())
        took = step_s(int(R + lens.sum()), R, int(choice.draft_next.sum()))
        policy.observe_rate(R, 0, got, int((lens > 0).sum()), bool(choice.draft_next.any()), took)
        tokens, seconds = tokens + got, seconds + took
        skipped += int((~choice.draft_next).sum())
        has_drafts = choice.draft_next
    return tokens / seconds, skipped / (R * steps)


@pytest.mark.parametrize("mean", [0.85, 0.35], ids=["greedy-like", "sampled-like"])
@pytest.mark.parametrize("R", [1, 4, 16, 64])
def test_adaptive_is_at_least_as_fast_as_k0_and_the_fixed_chain(R, mean):
    """In a simulated engine whose costs and acceptance the policy knows, adaptive
    verification must reach at least 0.98x the better of K=0 and the fixed chain at every
    load, confident (greedy-like) or not (sampled-like); what it gives up is its probes."""
    q = quality(R, mean, seed=R)
    rate, _ = adaptive_rate(q)
    best = max(k0_rate(R), fixed_rate(q))
    assert rate >= 0.98 * best, (rate, k0_rate(R), fixed_rate(q))


def test_unconfident_requests_at_high_load_skip_most_drafter_passes():
    """Where drafting does not pay (64 streams, low acceptance) the policy must skip most
    drafter passes (probing each request every few steps), and keep nearly all of them
    for one confident stream."""
    _, skipped = adaptive_rate(quality(64, 0.2, seed=1))
    assert skipped > 0.6
    _, skipped = adaptive_rate(quality(1, 0.85, seed=1))
    assert skipped < 0.1
