"""The verify budget: how many drafts of each request one step verifies (DSpark paper,
Algorithm 1, confidence-scheduled verification), as a pure numpy function.

    survival  a[r, j] = prod_{i <= j} c[r, i]          (chance drafts 0..j all match)
    tokens    tau(l)  = sum_r (1 + sum_{j < l_r} a[r, j])
    rows      B(l)    = sum_r (1 + l_r)
    step time cost(l) = cost_s(sum_r l_r), e.g. base_s + row_s * sum_r l_r (engine/step_cost.py)

We pick l maximising tau / cost, i.e. tokens per second. For a given number k of verified
drafts the best tau takes the k largest survivals, and since a[r, :] never increases along
j those k slots are a contiguous prefix of every request: so ranking all slots once by
survival turns the search into a staircase of k = 0..sum(cap), and we take its GLOBAL
argmax rather than the paper's first descent: with a linear cost the staircase is unimodal
and both agree, but a profiled or tile-quantised cost (rows padded to a tile of 4 or 8) is
not, and the scan costs the same. Ties rank by (request, position), independent of the values, and
among equal optima the larger k wins, so free rows verify the whole window (today's chain).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

SURVIVAL_STEPS = 1 << 40  # survivals closer than 2^-40 rank as equal (by slot index)


class Budget(NamedTuple):
    verify_len: np.ndarray  # [R] int32: drafts verified per request (rows = 1 + verify_len)
    expected_tokens: float  # tau at verify_len
    step_s: float  # the predicted step time at verify_len
    gain: np.ndarray  # [R] float64: expected tokens beyond the first, sum_{j < l_r} a[r, j]


def survival(conf: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """a [R, K] float64: cumulative products of the clipped confidences, 0 beyond cap[r]."""
    conf = np.clip(np.nan_to_num(np.asarray(conf, dtype=np.float64), nan=0.0), 0.0, 1.0)  # [R, K]
    surv = np.cumprod(conf, axis=1)  # [R, K]
    K = surv.shape[1]
    return np.where(np.arange(K)[None, :] < np.asarray(cap)[:, None], surv, 0.0)


def linear_cost(base_s: float, row_s: float) -> Callable[[np.ndarray], np.ndarray]:
    """The step time for k verified drafts: base_s (no draft verified) + row_s per row."""
    base_s, row_s = max(float(base_s), 1e-12), max(float(row_s), 0.0)
    return lambda k: base_s + row_s * k


def solve_budget(surv: np.ndarray, cap: np.ndarray, cost_s: Callable[[np.ndarray], np.ndarray]) -> Budget:
    """surv [R, K] from survival(); cap [R] int in 0..K; cost_s(k [n+1]) -> [n+1] seconds:
    the step time with k drafts verified in all (> 0), e.g. linear_cost(base_s, row_s)."""
    R, K = surv.shape
    cap = np.minimum(np.asarray(cap, dtype=np.int64), K)  # [R]
    eligible = np.arange(K)[None, :] < cap[:, None]  # [R, K]
    # NOTE: one integer key per slot, unique, so any sort gives the same order (a stable
    # float sort is ~3x slower): survival on 40 bits, descending, then the row-major slot
    # index (request, position) as the value-independent tie-break, which keeps every
    # k-prefix of the ranking a per-request prefix even where c = 1. Ineligible slots get
    # the largest keys and fall behind the n = sum(cap) real ones.
    flat = np.where(eligible, surv, -1.0).ravel()  # [R * K]
    index_bits = max(1, int(R * K - 1).bit_length())
    quantised = np.rint((1.0 - flat) * SURVIVAL_STEPS).astype(np.int64)  # [R * K] in 0..2 * STEPS
    keys = (quantised << index_bits) | np.arange(R * K, dtype=np.int64)
    n = int(cap.sum())
    order = np.argsort(keys)[:n]  # [n] slots, best first
    tau = R + np.concatenate(([0.0], np.cumsum(flat[order])))  # [n + 1] tokens at k = 0..n
    cost = np.broadcast_to(np.asarray(cost_s(np.arange(n + 1)), dtype=np.float64), (n + 1,))  # [n + 1]
    theta = tau / cost  # [n + 1] tokens per second
    k = n - int(np.argmax(theta[::-1]))  # the LAST maximum: more rows on a tie
    chosen = order[:k]
    verify_len = np.bincount(chosen // K, minlength=R).astype(np.int32)  # [R]
    gain = np.bincount(chosen // K, weights=flat[chosen], minlength=R)  # [R]
    return Budget(verify_len, float(tau[k]), float(cost[k]), gain)
