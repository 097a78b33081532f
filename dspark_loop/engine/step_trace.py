"""What observers see of the engine: one StepTrace per step (phase times, rows per
partition, acceptance, finishes) and one RequestStats per finished request."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dspark_loop.contract.protocol import PartitionTrace, StepTrace
from dspark_loop.engine.observer import RequestStats
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.engine.scheduler import Scheduler


@dataclass(slots=True)
class StepTimes:
    """One step's clock readings, taken by the loop at its phase edges: perf_counter() for
    the phases, time.time() for when it began, the loop thread's CPU time for the host's
    share. The gather counts from when the loop began to wait for the step's results (its
    send in lockstep; planned ahead, the time between is other steps' work)."""

    wall: float  # time.time() at the plan's start
    start: float  # the plan's start
    cpu_start: float
    plan_end: float = 0.0  # the plan is built; it is sent now
    cpu_planned: float = 0.0
    gather_start: float = 0.0  # the loop waits for the results
    result_at: float = 0.0  # the results are in
    cpu_result: float = 0.0
    update_end: float = 0.0
    deliver_end: float = 0.0
    cpu_end: float = 0.0

    @classmethod
    def begin(cls) -> StepTimes:
        return cls(time.time(), time.perf_counter(), time.thread_time())

    def planned(self) -> None:
        self.plan_end = self.gather_start = time.perf_counter()
        self.cpu_planned = time.thread_time()

    def gather_from(self) -> None:
        self.gather_start = time.perf_counter()

    def waited(self) -> None:
        self.result_at = time.perf_counter()
        self.cpu_result = time.thread_time()

    def updated(self) -> None:
        self.update_end = time.perf_counter()

    def delivered(self) -> None:
        self.deliver_end = time.perf_counter()
        self.cpu_end = time.thread_time()

    @property
    def span_s(self) -> float:
        """Plan to delivery (lockstep: the step's whole cost)."""
        return self.deliver_end - self.start

    @property
    def host_cpu_s(self) -> float:
        """The loop thread's CPU in the step's own phases (plan, update, deliver)."""
        return (self.cpu_planned - self.cpu_start) + (self.cpu_end - self.cpu_result)


def step_trace(sched: Scheduler, step: ScheduledStep, results, num_waiting: int, times: StepTimes) -> StepTrace:
    parts = []
    for p, ps in enumerate(step.partitions):
        wasted = [] if ps.live is None or all(ps.live) else [j for j, ok in enumerate(ps.live) if not ok]
        leases = sched.partitions[p].leases
        parts.append(
            PartitionTrace(
                prefill_req_ids=[r.req_id for r, _, _ in ps.prefills],
                prefill_num_tokens=[n for _, n, _ in ps.prefills],
                decode_req_ids=ps.decode_req_ids.tolist(),
                decode_num_rows=int(ps.decode_rows.sum()),
                free_blocks=sched.partitions[p].cache.num_free(),
                leases_in_use=leases.num_in_use if leases else 0,
                verify_rows=int(ps.decode_rows[ps.decode_rows > 1].sum(dtype=np.int64)),
                num_drafter_skips=0 if ps.draft_next is None else int(len(ps.draft_next) - ps.draft_next.sum()),
                num_placeholder_rows=ps.num_placeholder_rows,
                num_open_starts=ps.num_open_starts,
                wasted_req_ids=[ps.decode_reqs[j].req_id for j in wasted],
                num_wasted_rows=int(ps.decode_rows[wasted].sum()) if wasted else 0,
            )
        )
    compute = [r.compute_s for r in results] or [0.0]
    return StepTrace(
        step_id=step.step_id,
        wall_time=times.wall,
        schedule_s=times.plan_end - times.start,
        compute_max_s=max(compute),
        compute_min_s=min(compute),
        gather_s=times.result_at - times.gather_start,
        update_s=times.update_end - times.result_at,
        deliver_s=times.deliver_end - times.update_end,
        partitions=parts,
        accepted_req_ids=step.accepted_req_ids,
        accepted_lens=step.accepted_lens,
        accepted_num_drafts=step.accepted_num_drafts,
        num_new_tokens=step.num_new_tokens,
        preempted_req_ids=step.preempted_req_ids,
        aborted_req_ids=step.aborted_req_ids,
        finished_req_ids=[r.req_id for r in step.finished],
        finished_reasons=[r.finish_reason or "" for r in step.finished],
        num_running=sched.num_running,
        num_waiting=num_waiting,
        overlapped=step.overlapped,
        masks_s=step.masks_s,
    )


def request_stats(req: Request) -> RequestStats:
    return RequestStats(
        request_id=req.request_id,
        num_prompt_tokens=req.prompt_len,
        num_output_tokens=len(req.output_ids),
        num_cached_tokens=req.num_cached_tokens,
        finish_reason=req.finish_reason or "",
        arrival_time=req.arrival_time,
        first_token_time=req.first_token_time,
        finish_time=req.finish_time or time.monotonic(),
        inter_token_s=req.inter_token_s,
        num_verify_steps=req.num_verify_steps,
        num_proposed=req.num_proposed,
        num_matched=req.num_matched,
        num_accepted=req.num_accepted,
        num_fallback_steps=req.num_fallback_steps,
        num_drafter_skips=req.num_drafter_skips,
    )
