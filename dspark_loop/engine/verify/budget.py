"""The verify budget: how many drafts of each request one step verifies (DSpark paper,
Algorithm 1, confidence-scheduled verification), as a pure numpy function.

    survival  a[r, j] = prod_{i <= j} c[r, i]          (chance drafts 0..j all match)
    tokens    tau(l)  = sum_r (1 + sum_{j < l_r} a[r, j])
    rows      B(l)    = sum_r (1 + l_r)
    step time T(l)    = max_p (base_s[p] + drafts_s(p, sum_{r in p} l_r))   (cost_table.py)

We pick l maximising tau / T, i.e. tokens per second. Within a partition, for m verified
drafts the best tau takes its m largest survivals, and since a[r, :] never increases along
j those m slots are a contiguous prefix of every request: ranking the slots once by
survival turns each partition into a staircase m = 0..n_p. A step time T then lets every
partition verify its first m_p(T) slots (the most whose cost fits in T), so we evaluate
tau / T at every breakpoint T = base_s[p] + drafts_s(p, m) and take the GLOBAL argmax, not
the paper's first descent: with one partition and a linear cost the staircase is
unimodal and both agree, but with several partitions, or a tile-quantised drafts_s (rows
padded to tiles of 4 or 8), it is not. Ties rank by (request, position), independent of
the values; among equal optima the larger T wins, so free rows verify the whole window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

SURVIVAL_BITS = 41  # survivals closer than 2^-40 rank as equal (by slot index): keys 0..2^40
SURVIVAL_STEPS = 1 << (SURVIVAL_BITS - 1)


class Budget(NamedTuple):
    verify_len: np.ndarray  # [R] int32: drafts verified per request (rows = 1 + verify_len)
    expected_tokens: float  # tau at verify_len
    step_s: float  # the predicted step time at verify_len
    gain: np.ndarray  # [R] float64: expected tokens beyond the first, sum_{j < l_r} a[r, j]


def survival(conf: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """a [R, K] float64: cumulative products of the clipped confidences, 0 beyond cap[r]."""
    conf = np.fmin(np.fmax(np.asarray(conf, dtype=np.float64), 0.0), 1.0)  # [R, K]; fmax: NaN -> 0
    surv = np.cumprod(conf, axis=1)  # [R, K]
    surv[np.arange(surv.shape[1])[None, :] >= np.asarray(cap)[:, None]] = 0.0
    return surv


def solve_budget(
    surv: np.ndarray,
    cap: np.ndarray,
    base_s,
    drafts_s: Callable[[np.ndarray, np.ndarray], np.ndarray],
    partition: np.ndarray | None = None,
) -> Budget:
    """surv [R, K] from survival(); cap [R] int in 0..K; base_s [P] (or a float: P = 1):
    each partition's step time with no draft verified (> 0); drafts_s(p [M], m [M]) -> [M]:
    the extra time of m verified drafts in partition p, non-decreasing in m, 0 at m = 0;
    partition [R] int in 0..P-1 (None: all in partition 0)."""
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
    # NOTE: one integer key per slot, unique, so sorting the keys themselves orders the
    # slots (a stable float sort is ~3x slower, an argsort ~2x a sort): the partition,
    # then survival on 40 bits, descending, then the row-major slot index (request,
    # position) as the value-independent tie-break, which keeps every m-prefix of a
    # partition's ranking a per-request prefix even where c = 1; the slot reads back
    # from the low bits. Sorted, the slots line up partition by partition, best first within.
    index_bits = max(1, int(R * K - 1).bit_length())
    quantised = np.rint((1.0 - values) * SURVIVAL_STEPS).astype(np.int64)  # [n] in 0..STEPS
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
    rank = np.arange(n) - (np.cumsum(counts) - counts)[slot_part]  # [n] rank within its partition
    # Each slot's breakpoint: the step time at which its partition verifies it, base_s[p] +
    # drafts_s(p, its rank in the partition + 1). A step time T verifies, in every partition,
    # the slots whose breakpoint is <= T: a prefix of the partition's ranking (breakpoints
    # never fall along it). So one stable sort of the breakpoints lines up every candidate
    # T (P sorted runs: a stable sort merges them), and tau(T) is a running sum over it.
    breakpoint_s = base_s[slot_part] + drafts_s(slot_part, rank + 1)  # [n]
    ascending = np.argsort(breakpoint_s, kind="stable")  # [n]
    by_time = ranked[ascending]  # [n] slots, by step time
    t = np.append(breakpoint_s[ascending], np.inf)  # [n + 1] ascending, then a sentinel
    tau = R + np.concatenate(([0.0], np.cumsum(flat[by_time])))  # [n + 1]: the first j slots
    slowest = float(base_s.max())  # no step is shorter than the busiest partition's base
    first = int(np.searchsorted(t, slowest, side="right"))  # slots free at T = slowest
    # candidates: j = first (T = slowest), and every later j that ends a run of equal breakpoints
    j = np.concatenate(([first], first + 1 + np.flatnonzero(t[first + 1 :] != t[first:-1])))  # [C]
    times = np.concatenate(([slowest], t[j[1:] - 1]))  # [C] T of candidate j: t[j - 1]
    ratio = tau[j] / times  # [C]
    c = len(j) - 1 - int(np.argmax(ratio[::-1]))  # the LAST maximum: more rows on a tie
    chosen = by_time[: j[c]]
    verify_len = np.bincount(chosen // K, minlength=R).astype(np.int32)  # [R]
    gain = np.bincount(chosen // K, weights=flat[chosen], minlength=R)  # [R]
    return Budget(verify_len, float(tau[j[c]]), float(times[c]), gain)
