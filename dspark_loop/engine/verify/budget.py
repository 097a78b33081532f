"""The verify budget: how many drafts of each request one step verifies (DSpark paper,
Algorithm 1, confidence-scheduled verification), as a pure numpy function.

    survival  a[r, j] = prod_{i <= j} c[r, i]          (chance drafts 0..j all match)
    tokens    tau(l)  = sum_r (1 + sum_{j < l_r} a[r, j])
    step time T(l)    = max_p (base_s[p] + drafts_s(p, sum_{r in p} l_r))   (cost_table.py)

l maximises tau / T. Since a[r, :] never increases along j, ranking the slots once by
survival turns each partition into a staircase of prefixes; every breakpoint T is
evaluated and the GLOBAL argmax taken (with several partitions or a tiled drafts_s the
staircase is not unimodal, so the paper's first descent would stop early). Ties rank by
(request, position); among equal optima the larger T wins, so free rows verify the whole
window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

SURVIVAL_BITS = 41  # survivals closer than 2^-40 rank as equal (by slot index): keys 0..2^40


class Budget(NamedTuple):
    verify_len: np.ndarray  # [R] int32: drafts verified per request (rows = 1 + verify_len)
    expected_tokens: float  # tau at verify_len
    step_s: float  # the predicted step time at verify_len
    gain: np.ndarray  # [R] float64: expected tokens beyond the first, sum_{j < l_r} a[r, j]


def survival(conf: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """a [R, K] float64: cumulative products of the clipped confidences, 0 beyond cap[r]."""
    conf = np.fmin(np.fmax(np.asarray(conf, dtype=np.float64), 0.0), 1.0)  # [R, K]; fmax: NaN -> 0
    return np.cumprod(conf, axis=1) * (np.arange(conf.shape[1])[None, :] < np.asarray(cap)[:, None])  # [R, K]


def solve_budget(
    surv: np.ndarray,
    cap: np.ndarray,
    base_s,
    drafts_s: Callable[[np.ndarray, np.ndarray], np.ndarray],
    partition: np.ndarray | None = None,
) -> Budget:
    """surv [R, K] from survival(); cap [R] in 0..K; base_s [P] (or a float): each partition's
    step time with no draft verified (> 0); drafts_s(p [M], m [M]) -> [M]: the extra time of m
    drafts in partition p, non-decreasing, 0 at 0; partition [R] in 0..P-1 (None: all 0)."""
    R, K = surv.shape
    base_s = np.maximum(np.atleast_1d(np.asarray(base_s, dtype=np.float64)), 1e-12)  # [P]
    P = len(base_s)
    partition = np.zeros(R, np.int64) if partition is None else np.asarray(partition, np.int64)  # [R]
    cap = np.minimum(np.asarray(cap, dtype=np.int64), K)  # [R]
    flat = surv.ravel()  # [R * K]
    if int(cap.min(initial=K)) >= K:  # every slot eligible (the steady state): no mask to build
        slots, values, slot_part = np.arange(R * K), flat, np.repeat(partition, K)
    else:
        slots = np.flatnonzero(np.arange(K)[None, :] < cap[:, None])  # [n] eligible, row-major (request, position)
        values, slot_part = flat[slots], partition[slots // K]  # [n] each
    n = len(slots)
    # one unique integer key per slot, sorted (~2x faster than an argsort): the partition, survival on 40
    # bits descending, then the slot (request, position; low bits): ranking prefixes are per-request prefixes
    index_bits = max(1, int(R * K - 1).bit_length())
    quantised = np.rint((1.0 - values) * (1 << (SURVIVAL_BITS - 1))).astype(np.int64)  # [n] in 0..2^40
    keys = (quantised << index_bits) | slots
    part_shift = SURVIVAL_BITS + index_bits
    if P == 1:
        ranked = np.sort(keys) & ((1 << index_bits) - 1)  # [n] slots, best first
        slot_part = np.zeros(n, np.int64)
    elif part_shift + (P - 1).bit_length() <= 63:
        keys = np.sort(keys | (slot_part << part_shift))  # partition by partition
        ranked, slot_part = keys & ((1 << index_bits) - 1), keys >> part_shift  # [n] each
    else:
        order = np.lexsort((keys, slot_part))
        ranked, slot_part = slots[order], slot_part[order]
    counts = np.bincount(slot_part, minlength=P)  # [P]
    rank = np.arange(1, n + 1) - np.repeat(np.cumsum(counts) - counts, counts)  # [n] 1 + rank within its partition
    # each slot's breakpoint: the step time at which its partition verifies it; a step time T verifies
    # those <= T (a prefix of each partition's ranking): one stable sort lines up every T, tau(T) a running sum
    breakpoint_s = base_s[slot_part] + drafts_s(slot_part, rank)  # [n]
    ascending = np.argsort(breakpoint_s, kind="stable")  # [n]
    by_time = ranked.take(ascending)  # [n] slots, by step time
    t = np.append(breakpoint_s.take(ascending), np.inf)  # [n + 1] ascending, then a sentinel
    tau = R + np.concatenate(([0.0], np.cumsum(flat.take(by_time))))  # [n + 1]: the first j slots
    slowest = float(base_s.max())  # no step is shorter than the busiest partition's base
    first = int(np.searchsorted(t, slowest, side="right"))  # slots free at T = slowest
    # candidates: j = first (T = slowest), and every later j that ends a run of equal breakpoints
    j = np.concatenate(([first], first + 1 + np.flatnonzero(t[first + 1 :] != t[first:-1])))  # [C]
    times = np.concatenate(([slowest], t[j[1:] - 1]))  # [C] T of candidate j: t[j - 1]
    ratio = tau[j] / times  # [C]
    c = len(j) - 1 - int(np.argmax(ratio[::-1]))  # the LAST maximum: more rows on a tie
    chosen = by_time[: j[c]]
    verify_len = np.bincount(chosen // K, minlength=R).astype(np.int32)  # [R]
    gain = np.bincount(chosen // K, weights=flat.take(chosen), minlength=R)  # [R]
    return Budget(verify_len, float(tau[j[c]]), float(times[c]), gain)
