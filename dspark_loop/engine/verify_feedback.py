"""What a verify policy learns from a finished step (Scheduler.observe_step): the step's
shape and cost per partition (VerifyPolicy.observe), and what its windows accepted against
the survival the policy predicted for them (observe_accepted, when the policy has it).

The step's cost: the busiest leader's work (StepResult.work_s), plus the host's CPU time
for the step in lockstep; with two steps in flight the work alone (the host's work runs
beside the ranks', and the wall time between two results is another step's when the mesh
computes inside send()). Without work times, the wall time, which a machine shared with
other work inflates.
"""

from __future__ import annotations

import numpy as np

from dspark_loop.engine.accept_calibration import request_class
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.engine.verify_policy import VerifyPolicy


def step_cost_s(results, wall_s: float, host_s: float | None, overlapped: bool) -> float:
    work = [r.work_s for r in results]
    if work and min(work) > 0 and (overlapped or host_s is not None):
        return max(work) + (0.0 if overlapped or host_s is None else host_s)
    return wall_s


def observe_step(
    policy: VerifyPolicy, step: ScheduledStep, results, wall_s: float, host_s: float | None, overlapped: bool
) -> None:
    parts = step.partitions
    prompt_rows = np.array([sum(n for _, n, _ in p.prefills) for p in parts], np.int64)
    num_rows = prompt_rows + np.array([int(p.decode_rows.sum()) for p in parts], np.int64)
    num_requests = np.array([len(p.decode_reqs) for p in parts], np.int64)
    num_drafted = np.array([len(r.draft_req_ids) // 4 for r in results], np.int64)
    context = np.array([int(p.decode_start.sum()) for p in parts], np.int64)
    step_s = step_cost_s(results, wall_s, host_s, overlapped)
    policy.observe(num_rows, num_requests, num_drafted, context, step_s, prompt_rows)
    observe_rate = getattr(policy, "observe_rate", None)
    observe_accepted = getattr(policy, "observe_accepted", None)
    rate = observe_rate is not None
    accepted = observe_accepted is not None and step.verify_survival is not None
    if not (rate or accepted):
        return
    reqs = [r for p in parts for r in p.decode_reqs]
    if not reqs or len(reqs) != len(step.accepted_lens):  # in plan order (StepApplier)
        return
    sampled = np.fromiter((r.sampled for r in reqs), bool, len(reqs))  # [n]
    constrained = np.fromiter((r.constraint is not None for r in reqs), bool, len(reqs))  # [n]
    if rate:
        busiest = int(np.argmax(num_rows))  # the partition whose shape set the step's time
        prefill_rows = int(num_rows[busiest]) - int(parts[busiest].decode_rows.sum())
        mix = (int(sampled.sum()), int(constrained.sum()))
        decode_rate(step, *mix, bool(num_drafted.any()), step_s, prefill_rows, observe_rate)
    if accepted:
        accepted_windows(step, reqs, request_class(sampled, constrained), observe_accepted)


def decode_rate(
    step: ScheduledStep,
    num_sampled: int,
    num_constrained: int,
    drafted: bool,
    step_s: float,
    prefill_rows: int,
    observe_rate,
) -> None:
    """A step's decode requests, the tokens they appended, how many of them verified
    drafts, whether a drafter pass ran, and the prompt rows the busiest partition computed
    beside them, for the policy's realised rates (engine/regime_guard.py)."""
    num_requests = len(step.accepted_lens)
    verifying = sum(int((p.decode_rows > 1).sum()) for p in step.partitions)
    tokens = sum(step.accepted_lens)
    observe_rate(
        num_requests,
        num_sampled,
        tokens,
        verifying,
        drafted,
        step_s,
        num_constrained=num_constrained,
        prefill_rows=prefill_rows,
    )


def accepted_windows(step: ScheduledStep, reqs: list, cls: np.ndarray, observe_accepted) -> None:
    """Each verifying request's predicted survival, with the drafts it verified and
    accepted, matched by req_id (the policy saw the requests in its own order). reqs: the
    step's decode requests in plan order; cls [n] their classes (request_class)."""
    assert step.verify_survival is not None
    ids, surv = step.verify_survival  # [R], [R, K]
    if not len(ids):
        return
    ids_in_plan = np.fromiter((r.req_id for r in reqs), np.int64, len(reqs))  # [n]
    order = np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids, ids_in_plan, sorter=order), len(ids) - 1)  # [n]
    row = order[at]  # [n] the policy's row of each planned request
    verify_len = np.concatenate([p.decode_rows for p in step.partitions]).astype(np.int64) - 1  # [n]
    keep = (ids[row] == ids_in_plan) & (verify_len > 0)
    if not keep.any():
        return
    accepted = np.minimum(np.asarray(step.accepted_lens, np.int64) - 1, verify_len)  # [n] drafts accepted
    observe_accepted(surv[row[keep]], verify_len[keep], accepted[keep], cls[keep])
