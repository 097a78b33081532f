"""Phase 2 of Scheduler.schedule (K=7): the verify policy's choices for the step -- each
decode request's verify length and drafter skip (choose_windows), and whether each prompt
that completes this step drafts from its first token (prompt_drafts).
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import attrgetter

import numpy as np

from dspark_loop.engine.constraints import Constraints
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.engine.verify.calibration import request_class
from dspark_loop.engine.verify.policy import VerifyPolicy
from dspark_loop.engine.verify.windows import decode_windows


def choose_windows(
    policy: VerifyPolicy,
    partitions: list[Partition],
    constraints: Constraints,
    step: ScheduledStep,
    inflight: int,
    verify_limit: int,
    prefill: tuple[int, int, int],
) -> bool:
    """Ask the policy for every decode request's verify length and drafter skip
    (Request.verify_len, .draft_next), one call over all partitions. Returns whether some
    request skips its drafter pass (the plans need a mask). verify_limit: the last start a
    verify may have; prefill: (chunk cap, seats, token budget) per partition.
    NOTE: planned ahead (inflight >= 0), a request's window starts at plan_pos and its
    drafts are the ones the unanswered step makes (plan_drafts); their confidences are
    not known yet: the policy reads the newest the host has (one step stale), which
    changes speed, never tokens."""
    w = decode_windows(partitions, inflight >= 0, verify_limit, prefill)
    if w is None:
        return False
    reqs, n = w.reqs, len(w.reqs)
    cap = np.minimum(w.cap, deliverable(reqs, inflight >= 0))  # [R]
    counts = np.bincount(w.partition, minlength=len(partitions)).tolist()
    ends = np.cumsum(counts).tolist()
    tables = [part.conf for part in partitions]
    assert all(t is not None for t in tables)  # K=7 partitions hold a conf table
    conf = np.concatenate(  # [R, K]
        [t[w.leases[e - c : e]] for t, c, e in zip(tables, counts, ends) if c]  # type: ignore[index]
    )
    conf[cap == 0] = 0.0
    conf[w.unknown & (cap > 0)] = np.nan  # the policy's prior for its class
    if constraints.num_live and inflight < 0:
        constraints.walk_windows(partitions, reqs, cap, conf)
    choice = policy.choose(conf, cap, w.partition, w.sampled, w.constrained, w.prompt_rows)
    verify_len, draft_next, surv = choice
    if surv is not None:  # the policy learns acceptance: it gets this back in observe_step
        step.verify_survival = (w.req_ids, surv, request_class(w.sampled, w.constrained, np.isnan(conf).any(axis=1)))
    if len(verify_len) != n or len(draft_next) != n:
        raise ValueError(f"verify policy answered {len(verify_len)}/{len(draft_next)} choices for {n} requests")
    drafting = np.asarray(draft_next, bool) & w.may  # [R]
    # NOTE: map(setattr, ...) sets the fields without Python bytecode per request
    deque(map(setattr, reqs, repeat("verify_len"), np.minimum(np.maximum(verify_len, 0), cap).tolist()), 0)
    deque(map(setattr, reqs, repeat("draft_next"), drafting.tolist()), 0)
    return not drafting.all()


def deliverable(reqs: list[Request], planned: bool) -> np.ndarray:
    """[R] the most drafts each request can still turn into tokens: its tokens left to the
    length limit, less the step's own token and (planned ahead, its row pending) the one
    the unanswered step gives at least. A draft past that is accepted by the ranks and cut
    by the finish: verifying it costs a row and delivers nothing."""
    n = len(reqs)
    left = np.fromiter(map(attrgetter("length_at"), reqs), np.int64, n)
    left -= np.fromiter(map(len, map(attrgetter("output_ids"), reqs)), np.int64, n)
    if planned:
        left -= np.fromiter(map(attrgetter("plan_pending"), reqs), np.int64, n)
    return np.maximum(left - 1, 0)


def prompt_drafts(policy: VerifyPolicy, prefills: list[tuple[Request, int]]) -> None:
    """K=7: whether each prompt that completes this step drafts from its first token
    (Request.draft_next, the chunk's `draft`): the verify policy's call for a request
    of its class (drafts_prompt), never where its speculation is off."""
    for r, n in prefills:
        if r.plan_pos + n == r.prefill_target:
            cls = int(request_class(r.sampled, r.constraint is not None))
            r.draft_next = r.max_draft_tokens > 0 and policy.drafts_prompt(cls)
