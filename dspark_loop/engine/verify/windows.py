"""The decode requests a step's verify policy sees (Scheduler._choose_windows), as arrays
read in one C-level pass over the running requests (operator.attrgetter):

    reqs, partition [R]  the decode requests (position >= prefill_target), partition by partition
    cap [R] 0..K         the most each may verify (its max_draft_tokens where it has drafts and
                         its window fits under verify_limit, else 0)
    may [R]              its speculation is on (max_draft_tokens > 0)
    sampled, constrained [R]  temperature > 0; an output grammar masks its rows
    unknown [R]          planned ahead: its drafts are the unanswered step's, not the table's yet
    leases, req_ids [R]  its drafter lease (its row of the conf table) and req_id
    prompt_rows [P]      the prompt rows each partition is expected to compute beside: its
                         prefilling requests' next chunks and the queue heads its free seats
                         admit, each at most chunk_cap, in all at most the token budget
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
    """A partition's prompt_rows (module docstring): prefill_rows plus the queue heads it admits."""
    rows = prefill_rows
    for i, r in enumerate(part.waiting):
        if i >= seats - len(part.running) or rows >= budget:
            break
        rows += min(r.num_tokens, chunk_cap)
    return min(rows, budget)


def decode_windows(partitions, planned: bool, verify_limit: int, prefill=(0, 0, 0)) -> DecodeWindows | None:
    """partitions: the scheduler's; planned: one step is unanswered (positions plan_pos, drafts
    plan_drafts where plan_pending); verify_limit: the last position a full window may start
    at; prefill: (chunk_cap, seats per partition, token budget). None: no decode request."""
    get = attrgetter("plan_pos" if planned else "num_computed", *_FIELDS)
    running = [r for part in partitions for r in part.running]
    sizes = [len(part.running) for part in partitions]
    N = len(running)
    W = 1 + len(_FIELDS)
    f = np.fromiter(chain.from_iterable(map(get, running)), np.int64, N * W).reshape(N, W)
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
    constraints = map(attrgetter("constraint"), reqs)
    return DecodeWindows(
        reqs=reqs,
        partition=where[decode],
        cap=np.where(d & (pos <= verify_limit), m, 0).astype(np.int32),
        may=m > 0,
        sampled=f[:, 4] != 0,
        constrained=np.fromiter(map(is_not, constraints, repeat(None)), bool, R),
        unknown=a & d,
        leases=lease,
        prompt_rows=np.array([prompt_rows(p, n, *prefill) for p, n in zip(partitions, prefill_rows)], np.int64),
        req_ids=f[:, 8],
    )
