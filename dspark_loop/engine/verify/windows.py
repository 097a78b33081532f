"""The decode requests a step's verify policy sees (Scheduler._choose_windows), as arrays.

One pass over the running requests reads the fields the choice needs into one tuple per
request, made one int64 array (one array, not a list per field: the fewest Python calls
per request); the rest is numpy.

    reqs       [R] the decode requests (position >= prefill_target), partition by partition,
               each partition's in its running order
    partition  [R] int32 their partition index
    cap        [R] int32 in 0..K: the most each may verify (its own max_draft_tokens where it
               has drafts and its window fits under verify_limit, else 0)
    may        [R] bool: its speculation is on (max_draft_tokens > 0); a request that may
               never verify never drafts
    sampled    [R] bool: it samples (temperature > 0)
    constrained [R] bool: an output grammar masks its rows (Request.constraint)
    unknown    [R] bool: planned ahead, its drafts are the ones the unanswered step makes
               for a request that had none: the host holds no confidences for them yet
    leases     [R] int64: its drafter lease (the row of its partition's conf table)
    prompt_rows [P] int64: the prompt rows each partition is expected to compute beside its
               decode rows: its prefilling requests' next chunks and the queue heads its
               free seats admit, each at most chunk_cap, in all at most the token budget
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class DecodeWindows(NamedTuple):
    reqs: list
    partition: np.ndarray
    cap: np.ndarray
    may: np.ndarray
    sampled: np.ndarray
    constrained: np.ndarray
    unknown: np.ndarray
    leases: np.ndarray
    prompt_rows: np.ndarray


def prompt_rows(part, planned: bool, chunk_cap: int, seats: int, budget: int) -> int:
    """The prompt rows a partition is expected to compute this step (module docstring)."""
    rows = 0
    for r in part.running:
        p = r.plan_pos if planned else r.num_computed
        if 0 <= p < r.prefill_target:
            rows += min(r.prefill_target - p, chunk_cap)
    for i, r in enumerate(part.waiting):
        if i >= seats - len(part.running) or rows >= budget:
            break
        rows += min(r.num_tokens, chunk_cap)
    return min(rows, budget)


def decode_windows(partitions, planned: bool, verify_limit: int, prefill=(0, 0, 0)) -> DecodeWindows | None:
    """partitions: the scheduler's, each with .running; planned: one step is unanswered
    (positions are plan_pos, drafts plan_drafts where plan_pending); verify_limit: the last
    position a full window may start at; prefill: (chunk_cap, seats per partition, token
    budget) for prompt_rows. None: no decode request."""
    reqs: list = []
    fields: list[tuple] = []  # per request: lease, max drafts, position, sampled, constrained, has, ahead, drafted
    sizes: list[int] = []
    for part in partitions:
        first = len(reqs)
        for r in part.running:
            p = r.plan_pos if planned else r.num_computed
            if p >= r.prefill_target:
                reqs.append(r)
                h, a = r.has_drafts, planned and r.plan_pending
                row = (r.lease, r.max_draft_tokens, p, r.sampled, r.constraint is not None, h, a)
                fields.append((*row, r.plan_drafts if a else h))
        sizes.append(len(reqs) - first)
    if not reqs:
        return None
    f = np.array(fields, np.int64)  # [R, 8]
    lease, m, pos = f[:, 0], f[:, 1].astype(np.int32), f[:, 2]  # [R] each
    h, ah, d = f[:, 5] != 0, f[:, 6] != 0, f[:, 7] != 0  # [R] each
    return DecodeWindows(
        reqs=reqs,
        partition=np.repeat(np.arange(len(sizes), dtype=np.int32), sizes),
        cap=np.where(d & (pos <= verify_limit), m, 0).astype(np.int32),
        may=m > 0,
        sampled=f[:, 3] != 0,
        constrained=f[:, 4] != 0,
        unknown=ah & d & ~h,
        leases=lease,
        prompt_rows=np.array([prompt_rows(p, planned, *prefill) for p in partitions], np.int64),
    )
