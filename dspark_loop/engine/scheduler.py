"""The scheduler: which rows every partition computes next, and what their results mean.

schedule() and update() are synchronous and pure CPU; the loop owns all I/O. Request lifecycle:
add() -> waiting -> (admitted) running: prefill chunks, then decode rows -> finished (stop /
length / abort / error); running -> waiting again on preemption.
"""

from __future__ import annotations

import time
from functools import partial

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.protocol import (
    DSPARK_K,
    MAX_CHUNK,
    BlockUpdate,
    PartitionPlan,
    StepMasks,
    StepPlan,
)
from dspark_loop.engine.admission import Admission
from dspark_loop.engine.constraints import Constraints, Failed
from dspark_loop.engine.kv_cache import PartitionCache
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput, error_output
from dspark_loop.engine.page_mapping import map_pages
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.plan_builder import partition_step
from dspark_loop.engine.prefix_cache import PrefixCache
from dspark_loop.engine.request import Request, Status, make_request
from dspark_loop.engine.row_budget import budget_rows
from dspark_loop.engine.scheduled_step import PartitionStep, ScheduledStep, reconcile
from dspark_loop.engine.spec_counters import SpecCounters
from dspark_loop.engine.step_apply import StepApplier
from dspark_loop.engine.step_start import plan_starts
from dspark_loop.engine.step_update import read_results
from dspark_loop.engine.verify.feedback import observe_step
from dspark_loop.engine.verify.policy import FullVerify, VerifyPolicy
from dspark_loop.engine.window_choice import choose_windows, prompt_drafts


class Scheduler:
    def __init__(
        self,
        layout: CacheLayout,
        num_partitions: int,
        num_blocks: list[int],
        max_num_seqs: int,
        max_num_batched_tokens: int,
        long_prefill_token_threshold: int,
        max_model_len: int,
        eos_token_ids,
        spec_k: int = 0,
        enable_prefix_caching: bool = True,
        policy: VerifyPolicy | None = None,
        log_progress: bool = True,
    ):
        if spec_k not in (0, DSPARK_K):
            raise ValueError(f"spec_k must be 0 or {DSPARK_K} (the verify tile is {DSPARK_K + 1} rows), got {spec_k}")
        if max_num_seqs < num_partitions:
            raise ValueError(f"max_num_seqs {max_num_seqs} < {num_partitions} partitions")
        self.layout = layout
        self.max_seqs_per_partition = max_num_seqs // num_partitions
        num_leases = self.max_seqs_per_partition if spec_k else 0
        self.partitions = [
            Partition(p, PartitionCache(layout, list(num_blocks)), num_leases) for p in range(num_partitions)
        ]
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunk_cap = min(MAX_CHUNK, max_num_batched_tokens, long_prefill_token_threshold or max_num_batched_tokens)
        self.spec = SpecCounters(log_progress=log_progress)  # False: the progress line is not logged
        self.max_model_len = max_model_len
        self.eos_token_ids = tuple(int(e) for e in eos_token_ids)
        self.spec_k = spec_k
        self.prefix = PrefixCache(layout, spec_k) if enable_prefix_caching else None
        self.admission = Admission(self.prefix, self.chunk_cap, self.max_seqs_per_partition, self.spec)
        self.applier = StepApplier(self.spec, self.prefix, spec_k, self._end)
        self.requests: dict[str, Request] = {}  # live (waiting or running), by API id
        self._next_step_id = 0
        self._aborted_req_ids: list[int] = []
        self._early_outputs: list[RequestOutput] = []  # finished outside a step (errors)
        self._early_finished: list[Request] = []
        self.num_preemptions = 0
        self._num_ended = 0  # with num_preemptions: requests that left running (read_results' check_live)
        self._unanswered: list[int] = []  # ids of sent (non-empty) steps not yet updated, oldest first
        self._flying: ScheduledStep | None = None  # the step planned ahead and not yet updated
        self.constraints = Constraints(spec_k)  # the output grammars' part of each step
        # K=7 adaptive verification: who chooses the windows and drafter skips (FullVerify:
        # the fixed chain, no per-step call); live requests with max_draft_tokens < K
        self.policy: VerifyPolicy = policy if policy is not None else FullVerify()
        self.num_capped = 0

    def make_request(self, g: GenerateRequest, detokenizer=None) -> Request:
        """Validate and cap a GenerateRequest; raises ValueError for what can never run."""
        return make_request(g, self.max_model_len, self.eos_token_ids, detokenizer)

    def add(self, req: Request) -> None:
        if req.prompt_len >= self.max_model_len or req.prompt_len == 0:
            raise ValueError(f"prompt of {req.prompt_len} tokens does not fit the context of {self.max_model_len}")
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        if req.status != Status.WAITING:
            raise ValueError(f"{req} is not a new request")
        part = self.admission.place(self.partitions, req)
        req.partition = part.index
        part.waiting.append(req)
        self.requests[req.request_id] = req
        if req.constraint is not None:
            self.constraints.num_live += 1
        if req.max_draft_tokens < DSPARK_K:
            self.num_capped += 1

    def abort(self, request_id: str) -> bool:
        """Finish a live request now ("abort") and free its pages; False if unknown."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        if req.status == Status.RUNNING:
            self._aborted_req_ids.append(req.req_id)
        self._end(req, "abort")
        req.finish_time = time.monotonic()
        self._early_finished.append(req)  # observers see it with the next update
        return True

    def carry_over(self) -> tuple[list[Request], list[Request], list[RequestOutput]]:
        """The mesh died: (running, waiting in arrival order, undelivered outputs), all forgotten
        here (a restart replaces the scheduler; waiting requests re-run as if preempted)."""
        running = [r for p in self.partitions for r in p.running]
        waiting = sorted((r for p in self.partitions for r in p.waiting), key=lambda r: r.arrival_time)
        outputs, self._early_outputs = self._early_outputs, []
        for p in self.partitions:
            p.running.clear()
            p.waiting.clear()
        self.requests.clear()
        self.constraints.num_live = 0
        self.num_capped = 0
        return running, waiting, outputs

    @property
    def num_running(self) -> int:
        return sum(len(p.running) for p in self.partitions)

    @property
    def num_waiting(self) -> int:
        return sum(len(p.waiting) for p in self.partitions)

    @property
    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._early_outputs)

    def kv_cache_usage(self) -> float:
        return sum(p.cache.usage() for p in self.partitions) / len(self.partitions)

    def check_integrity(self) -> None:
        for part in self.partitions:
            part.check_integrity()

    # ---- step 2 -----------------------------------------------------------------------
    def schedule(self, ahead: bool = False, defer_masks: bool = False) -> ScheduledStep:
        """ahead: the caller may send this step before the previous one is answered (async scheduling).
        defer_masks: the caller asks late_masks() for the masks of one-row constrained requests once
        the plan is sent (StepPlan.masks_follow); False: every mask is in the plan."""
        # The phases, in order, a file each:
        #   step_start     where each running request's rows start (plan_pos)
        #   window_choice  K=7: the verify policy's windows and drafter skips; per partition:
        #   row_budget     rows under the token budget: decode rows, then prefill chunks, FCFS
        #   page_mapping   pages oldest request first; a dry pool preempts the NEWEST (recompute)
        #   admission      new requests, none where a request was preempted this step (its
        #                  freed id must reach the ranks before block updates for the same id)
        #   plan_builder   the wire plan, and what its results will mean
        # Async scheduling: one step unanswered at most; requests start where it leaves them.
        if len(self._unanswered) > 1:
            raise RuntimeError(f"steps {self._unanswered} unanswered: async scheduling plans one step ahead at most")
        inflight = self._unanswered[0] if self._unanswered else -1
        step = ScheduledStep(StepPlan(self._next_step_id, []), [], overlapped=inflight >= 0)
        step.left_mark = self._num_ended + self.num_preemptions
        self._next_step_id += 1
        step.aborted_req_ids, self._aborted_req_ids = self._aborted_req_ids, []
        flying = self._flying if inflight >= 0 else None  # the unanswered step is the one planned ahead
        plan_starts(self.partitions, flying, self.spec_k, self.max_model_len, defer_masks, self.constraints.num_live)
        adaptive = bool(self.spec_k) and (self.num_capped > 0 or self.policy.per_step)
        self.constraints.begin_step(defer_masks)
        masked = adaptive and self._choose_windows(step, inflight)
        for part in self.partitions:
            pstep, pplan = self._schedule_partition(part, step.preempted_req_ids, adaptive, masked)
            step.partitions.append(pstep)
            step.plan.partitions.append(pplan)
        step.plan.masks_follow = any(p.late_masked for p in step.partitions)
        if not step.is_empty and ahead:
            self._unanswered.append(step.step_id)
            self._flying = step  # what the next plan starts from (step_start.py)
        return step

    def _choose_windows(self, step: ScheduledStep, inflight: int) -> bool:
        """K=7, adaptive: the verify policy's windows and drafter skips (window_choice.py)."""
        prefill = (self.chunk_cap, self.max_seqs_per_partition, self.max_num_batched_tokens)
        limit = self.max_model_len - (self.spec_k + 1)
        return choose_windows(self.policy, self.partitions, self.constraints, step, inflight, limit, prefill)

    def _schedule_partition(
        self, part: Partition, preempted: list[int], adaptive: bool = False, masked: bool = False
    ) -> tuple[PartitionStep, PartitionPlan]:
        """One partition's share of the step, phase by phase. adaptive: the verify policy
        chose each decode request's window (choose_windows); masked: and some skip their
        drafter pass."""
        args = (self.chunk_cap, self.spec_k, self.max_model_len, adaptive)
        budget, prefilling = budget_rows(part, self.max_num_batched_tokens, *args)
        updates: list[BlockUpdate] = []
        num_preempted = len(preempted)
        decodes = map_pages(part, updates, preempted)
        self.num_preemptions += len(preempted) - num_preempted
        prefills = [(r, r.sched_n) for r in prefilling if r.sched_n and r.status == Status.RUNNING]
        if len(preempted) == num_preempted:
            for req, message in self.admission.admit(part, budget, prefills, updates):
                self._report_error(req, message)
        if self.spec_k:
            prompt_drafts(self.policy, prefills)
        failed: Failed = []
        mask = partial(self.constraints.masks, failed) if self.constraints.num_live else None
        pstep, pplan = partition_step(part, prefills, decodes, updates, masked, mask)
        # NOTE: after the plan is built: the row still runs (it is in the plan); update()
        # skips a request that is no longer running, and its pages are freed in the next plan.
        self._fail_in_step(failed)
        return pstep, pplan

    def late_masks(self, step: ScheduledStep) -> StepMasks:
        """The masks the step's plan left out (masks_follow): Constraints.late_masks; a
        request whose constraint fails ends with an error."""
        failed: Failed = []
        per_part = self.constraints.late_masks(step, failed)
        self._fail_in_step(failed)
        return StepMasks(step.step_id, per_part)

    def needs_lockstep(self, inflight: int) -> bool:
        """Whether the next step must wait for step `inflight`'s answer (Constraints)."""
        fly = self._flying  # the step planned ahead; None in lockstep
        return fly is not None and fly.step_id == inflight and self.constraints.needs_lockstep(fly)

    # ---- step 5 -----------------------------------------------------------------------
    def update(self, step: ScheduledStep, results, now: float | None = None) -> list[RequestOutput]:
        """results: one leader StepResult per partition, in partition order. Applies what
        read_results() found (StepApplier): positions computed, tokens committed, finishes,
        drafts."""
        now = time.monotonic() if now is None else now
        outputs, self._early_outputs = self._early_outputs, []
        step.finished.extend(self._early_finished)
        self._early_finished = []
        if step.is_empty:
            return outputs
        if step.step_id in self._unanswered:
            self._unanswered.remove(step.step_id)
            self._flying = None if self._flying is step else self._flying
        check_live = self._num_ended + self.num_preemptions != step.left_mark  # one of the step's may have left
        for part, pstep in zip(self.partitions, step.partitions):
            if pstep.filled is not None and part.drafts is not None:
                reconcile(pstep, part.drafts)
        updates = read_results(step, results, self.spec_k, self.max_model_len, check_live)
        for part, update in zip(self.partitions, updates):
            self.applier.apply(part, step, update, now, outputs)
        return outputs

    @property
    def observes_steps(self) -> bool:
        """Whether the loop must report step times (a verify policy that learns from them)."""
        return bool(self.spec_k) and self.policy.learns

    def observe_step(
        self, step: ScheduledStep, results, wall_s: float, host_s: float | None = None, overlapped: bool = False
    ) -> None:
        """Tell the verify policy what a finished step computed and cost, and what its
        windows accepted (engine/verify/feedback.py)."""
        observe_step(self.policy, step, results, wall_s, host_s, overlapped)

    def _end(self, req: Request, reason: str) -> None:
        """The one way a live request ends (finish rules, abort, error): its partition
        ends it, the Scheduler forgets it."""
        self.partitions[req.partition].end(req, reason)
        self._num_ended += 1
        self._forget(req)

    def _forget(self, req: Request) -> None:
        if self.requests.pop(req.request_id, None) is not None:
            if req.constraint is not None:
                self.constraints.num_live -= 1
            if req.max_draft_tokens < DSPARK_K:
                self.num_capped -= 1

    def _fail_in_step(self, failed: Failed) -> None:
        for req, message in failed:
            self._end(req, "error")
            self._report_error(req, message)

    def _report_error(self, req: Request, message: str) -> None:
        """req has ended with an error (Partition.end): forget it, deliver the error."""
        self._forget(req)
        req.error = message
        req.finish_time = time.monotonic()
        self._early_finished.append(req)
        out = error_output(req.request_id, message, req.prompt_len, len(req.output_ids))
        out.num_cached_tokens = req.num_cached_tokens
        self._early_outputs.append(out)
