"""What a verify policy learns from a finished step (Scheduler.observe_step), as one
StepFeedback. The step's cost: the busiest leader's work (StepResult.work_s), plus the
host's CPU for the step in lockstep; with two steps in flight the work alone and the host's
CPU beside it (StepFeedback.host_s). Without work times, the wall time."""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K, as_f32
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.engine.verify.policy import StepFeedback, VerifyPolicy


def step_cost_s(results, wall_s: float, host_s: float | None, overlapped: bool) -> float:
    work = [r.work_s for r in results]
    if work and min(work) > 0 and (overlapped or host_s is not None):
        return max(work) + (0.0 if overlapped or host_s is None else host_s)
    return wall_s


def observe_step(
    policy: VerifyPolicy, step: ScheduledStep, results, wall_s: float, host_s: float | None, overlapped: bool
) -> None:
    parts = step.partitions
    num_requests = np.array([len(p.decode_reqs) for p in parts], np.int64)
    drafts = np.array([int(p.decode_rows.sum()) for p in parts], np.int64) - num_requests
    prompt_rows = np.array([sum(n for _, n, _ in p.prefills) for p in parts], np.int64)
    drafted = np.array([len(r.draft_req_ids) > 0 for r in results], bool)
    num_reqs = int(num_requests.sum())
    windows = None
    made = [as_f32(r.draft_confidence) for r in results if len(r.draft_confidence)]
    if step.verify_survival is not None and num_reqs and num_reqs == len(step.accepted_lens):
        windows = accepted_windows(step)
    feedback = StepFeedback(
        num_requests,
        drafts,
        prompt_rows,
        drafted,
        step_cost_s(results, wall_s, host_s, overlapped),
        int(sum(step.accepted_lens)),
        windows,
        host_s if overlapped else None,
        np.concatenate(made).reshape(-1, DSPARK_K) if made else None,
    )
    policy.observe(feedback)


def accepted_windows(step: ScheduledStep) -> tuple | None:
    """Each verifying request's predicted survival, verified and accepted drafts and class,
    matched by req_id (the policy saw the requests in its own order) to the step's decode
    requests in plan order."""
    assert step.verify_survival is not None
    ids, surv, classes = step.verify_survival  # [R], [R, K], [R]
    if not len(ids):
        return None
    ids_in_plan = np.concatenate([p.decode_req_ids for p in step.partitions]).astype(np.int64)  # [n]
    order = np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids, ids_in_plan, sorter=order), len(ids) - 1)  # [n]
    row = order[at]  # [n] the policy's row of each planned request
    verify_len = np.concatenate([p.decode_rows for p in step.partitions]).astype(np.int64) - 1  # [n]
    keep = (ids[row] == ids_in_plan) & (verify_len > 0)
    if not keep.any():
        return None
    accepted = np.minimum(np.asarray(step.accepted_lens, np.int64) - 1, verify_len)  # [n] drafts accepted
    row = row[keep]
    return surv[row], verify_len[keep], accepted[keep], classes[row]
