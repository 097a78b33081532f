"""The decode requests a step's verify policy sees (Scheduler._choose_windows), as arrays.

One C-level pass over the running requests (operator.attrgetter) reads the fields the
choice needs, flattened into one int64 array (no Python bytecode per request); the rest
is numpy.

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
    req_ids    [R] int64: its req_id
    prompt_rows [P] int64: the prompt rows each partition is expected to compute beside its
               decode rows: its prefilling requests' next chunks and the queue heads its
               free seats admit, each at most chunk_cap, in all at most the token budget
"""

from __future__ import annotations

from itertools import chain, compress, repeat
from operator import attrgetter, is_not
from typing import NamedTuple

import numpy as np

# the fields read per running request, in this order (planned: plan_pos, else num_computed)
_FIELDS = (
    "prefill_target",
    "lease",
    "max_draft_tokens",
    "sampled",
    "has_drafts",
    "plan_pending",
    "plan_drafts",
    "req_id",
)
_PLANNED = attrgetter("plan_pos", *_FIELDS)
_LOCKSTEP = attrgetter("num_computed", *_FIELDS)
_NUM_FIELDS = 1 + len(_FIELDS)
_CONSTRAINT = attrgetter("constraint")


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
    req_ids: np.ndarray


def prompt_rows(part, prefill_rows: int, chunk_cap: int, seats: int, budget: int) -> int:
    """The prompt rows a partition is expected to compute this step (module docstring):
    prefill_rows, its prefilling requests' next chunks, plus the queue heads it admits."""
    rows = prefill_rows
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
    get = _PLANNED if planned else _LOCKSTEP
    running = [r for part in partitions for r in part.running]
    sizes = [len(part.running) for part in partitions]
    N = len(running)
    f = np.fromiter(chain.from_iterable(map(get, running)), np.int64, N * _NUM_FIELDS).reshape(N, _NUM_FIELDS)
    pos, target = f[:, 0], f[:, 1]  # [N] each
    decode = pos >= target  # [N]
    where = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)  # [N] partition of each running request
    # the prefilling requests' next chunks, per partition (0 <= position < prefill_target)
    chunk_cap = prefill[0]
    chunks = np.where(~decode & (pos >= 0), np.minimum(target - pos, chunk_cap), 0)  # [N]
    prefill_rows = np.bincount(where, chunks, len(sizes)).astype(np.int64).tolist()  # [P] (exact: < 2^53)
    if not decode.any():
        return None
    keep = decode.tolist()
    reqs = list(compress(running, keep))
    f = f[decode]  # [R, 9]
    R = len(reqs)
    lease, m, pos = f[:, 2], f[:, 3].astype(np.int32), f[:, 0]  # [R] each
    h, ah, d = f[:, 5] != 0, f[:, 6] != 0, f[:, 7] != 0  # [R] each
    a = ah if planned else np.zeros(R, bool)  # planned ahead: its drafts are plan_drafts
    d = np.where(a, d, h)  # [R] it has (or will have) drafts
    constraints = map(_CONSTRAINT, reqs)
    return DecodeWindows(
        reqs=reqs,
        partition=where[decode],
        cap=np.where(d & (pos <= verify_limit), m, 0).astype(np.int32),
        may=m > 0,
        sampled=f[:, 4] != 0,
        constrained=np.fromiter(map(is_not, constraints, repeat(None)), bool, R),
        unknown=a & d & ~h,
        leases=lease,
        prompt_rows=np.array([prompt_rows(p, n, *prefill) for p, n in zip(partitions, prefill_rows)], np.int64),
        req_ids=f[:, 8],
    )
