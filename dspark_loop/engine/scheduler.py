"""The scheduler: which rows every partition computes next, and what their results mean.

schedule() and update() are synchronous and pure CPU; the loop owns all I/O.
Request lifecycle: add() -> waiting -> (admitted) running: prefill chunks, then decode
rows -> finished (stop / length / abort / error); running -> waiting again on preemption.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

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
from dspark_loop.engine.finish_rules import FinishRules
from dspark_loop.engine.kv_cache import PartitionCache
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.prefix_cache import PrefixCache
from dspark_loop.engine.request import Request, Status
from dspark_loop.engine.scheduled_step import (
    PartitionStep,
    ScheduledStep,
    note_inflight,
    partition_step,
    plan_positions,
    reconcile,
)
from dspark_loop.engine.spec_counters import SpecCounters
from dspark_loop.engine.step_apply import StepApplier
from dspark_loop.engine.step_update import read_results
from dspark_loop.engine.verify.calibration import request_class
from dspark_loop.engine.verify.feedback import observe_step
from dspark_loop.engine.verify.policy import FullVerify, VerifyPolicy
from dspark_loop.engine.verify.windows import decode_windows


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
        self.spec = SpecCounters()
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
        self._ended_in_step = False  # a scheduled request ended before its results came back
        self._unanswered: list[int] = []  # ids of sent (non-empty) steps not yet updated, oldest first
        self.constraints = Constraints(spec_k)  # the output grammars' part of each step
        # K=7 adaptive verification: who chooses the windows and drafter skips (FullVerify:
        # the fixed chain, no per-step call); live requests with max_draft_tokens < K
        self.policy: VerifyPolicy = policy if policy is not None else FullVerify()
        self.num_capped = 0

    # ---- intake -----------------------------------------------------------------------
    def make_request(self, g: GenerateRequest, detokenizer=None) -> Request:
        """Validate and cap a GenerateRequest; raises ValueError for what can never run."""
        prompt_len = len(g.prompt_token_ids)
        if prompt_len == 0:
            raise ValueError("the prompt is empty")
        if prompt_len >= self.max_model_len:
            raise ValueError(
                f"the prompt has {prompt_len} tokens; the context is "
                f"{self.max_model_len} tokens including at least one output token"
            )
        p = g.params
        if p.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {p.max_tokens}")
        rules = FinishRules(
            eos_token_ids=self.eos_token_ids,
            stop_token_ids=tuple(int(t) for t in p.stop_token_ids),
            ignore_eos=p.ignore_eos,
            min_tokens=p.min_tokens,
            max_tokens=min(p.max_tokens, self.max_model_len - prompt_len),
            max_model_len=self.max_model_len,
        )
        req = Request(g.request_id, g.prompt_token_ids, p, rules, detokenizer, g.arrival_time or time.monotonic())
        req.constraint = g.constraint
        return req

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
            self._ended_in_step = True
        self._end(req, "abort")
        req.finish_time = time.monotonic()
        self._early_finished.append(req)  # observers see it with the next update
        return True

    def carry_over(self) -> tuple[list[Request], list[Request], list[RequestOutput]]:
        """The mesh died: (running requests, waiting ones in arrival order, outputs not yet
        delivered), and this scheduler forgets them all (it is replaced after a restart;
        waiting requests hold no pages and re-run from scratch, as after a preemption)."""
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

    # ---- state ------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return sum(len(p.running) for p in self.partitions)

    @property
    def num_waiting(self) -> int:
        return sum(len(p.waiting) for p in self.partitions)

    @property
    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._early_outputs)

    def num_free_blocks(self, partition: int) -> list[int]:
        return self.partitions[partition].cache.num_free()

    def kv_cache_usage(self) -> float:
        return sum(p.cache.usage() for p in self.partitions) / len(self.partitions)

    def check_integrity(self) -> None:
        for part in self.partitions:
            part.check_integrity()

    # ---- step 2 -----------------------------------------------------------------------
    def schedule(self, ahead: bool = False, defer_masks: bool = False) -> ScheduledStep:
        """ahead: the caller may send this step before the previous one is answered (async
        scheduling). defer_masks: the caller asks late_masks() for the masks of one-row
        constrained requests once the plan is sent (StepPlan.masks_follow); False: every
        mask is in the plan."""
        # Per partition, under a token budget: decode rows first (1, or 8 when verifying
        # drafts), then prefill chunks of running requests, then new admissions, FCFS.
        # Chunks are capped at chunk_cap so a long prompt never starves decodes.
        # Pages are mapped oldest request first; when a pool runs dry the NEWEST running
        # request is preempted by recompute (pages freed, back to the front of the queue,
        # it later re-prefills prompt + outputs and continues with identical tokens).
        # No admissions in a partition that preempted this step: its queue head is the
        # request that was just evicted, and its freed_req_ids must reach the ranks in
        # a plan before any new block update for the same req_id.
        # Async scheduling: with one step still unanswered (never more), its requests are
        # planned from where it leaves them (plan_positions), K=0 decode inputs it samples
        # are placeholders, and a request whose next step needs what it returns sits out.
        if len(self._unanswered) > 1:
            raise RuntimeError(f"steps {self._unanswered} unanswered: async scheduling plans one step ahead at most")
        inflight = self._unanswered[0] if self._unanswered else -1
        step = ScheduledStep(StepPlan(self._next_step_id, []), [], overlapped=inflight >= 0)
        if inflight < 0:
            self._ended_in_step = False
        self._next_step_id += 1
        step.aborted_req_ids, self._aborted_req_ids = self._aborted_req_ids, []
        if inflight >= 0:
            for part in self.partitions:
                plan_positions(part.running, inflight, self.spec_k, self.max_model_len, defer_masks)
        adaptive = bool(self.spec_k) and (self.num_capped > 0 or self.policy.per_step)
        self.constraints.begin_step(defer_masks)
        masked = adaptive and self._choose_windows(step, inflight)
        for part in self.partitions:
            pstep, pplan = self._schedule_partition(part, step.preempted_req_ids, inflight, adaptive, masked)
            step.partitions.append(pstep)
            step.plan.partitions.append(pplan)
        step.plan.masks_follow = any(p.late_masked for p in step.partitions)
        if not step.is_empty and ahead:
            self._unanswered.append(step.step_id)
            note_inflight(step)
        return step

    def _choose_windows(self, step: ScheduledStep, inflight: int = -1) -> bool:
        """K=7, adaptive: ask the policy for every decode request's verify length and
        drafter skip (Request.verify_len, .draft_next), one call over all partitions.
        Returns whether some request skips its drafter pass (the plans need a mask).
        NOTE: planned ahead (inflight >= 0), a request's window starts at plan_pos and its
        drafts are the ones the unanswered step makes (plan_drafts); their confidences are
        not known yet: the policy reads the newest the host has (one step stale), which
        changes speed, never tokens."""
        prefill = (self.chunk_cap, self.max_seqs_per_partition, self.max_num_batched_tokens)
        w = decode_windows(self.partitions, inflight >= 0, self.max_model_len - (self.spec_k + 1), prefill)
        if w is None:
            return False
        reqs, cap, n = w.reqs, w.cap, len(w.reqs)
        counts = np.bincount(w.partition, minlength=len(self.partitions)).tolist()
        ends = np.cumsum(counts).tolist()
        tables = [part.conf for part in self.partitions]
        assert all(t is not None for t in tables)  # K=7 partitions hold a conf table
        conf = np.concatenate(  # [R, K]
            [t[w.leases[e - c : e]] for t, c, e in zip(tables, counts, ends) if c]  # type: ignore[index]
        )
        conf[cap == 0] = 0.0
        conf[w.unknown & (cap > 0)] = np.nan  # the policy's prior for its class
        if self.constraints.num_live and inflight < 0:
            self.constraints.walk_windows(self.partitions, reqs, cap, conf)
        choice = self.policy.choose(conf, cap, w.partition, w.sampled, w.constrained, w.prompt_rows)
        verify_len, draft_next, surv = choice
        if surv is not None:  # the policy learns acceptance: it gets this back in observe_step
            step.verify_survival = (np.fromiter((r.req_id for r in reqs), np.int64, n), surv)
        if len(verify_len) != n or len(draft_next) != n:
            raise ValueError(f"verify policy answered {len(verify_len)}/{len(draft_next)} choices for {n} requests")
        drafting = np.asarray(draft_next, bool) & w.may  # [R]
        for req, vl, dn in zip(reqs, np.clip(verify_len, 0, cap).tolist(), drafting.tolist()):
            req.verify_len = vl
            req.draft_next = dn
        return not drafting.all()

    def _schedule_partition(
        self, part: Partition, preempted: list[int], inflight: int = -1, adaptive: bool = False, masked: bool = False
    ) -> tuple[PartitionStep, PartitionPlan]:
        """One partition's share of the step, phase by phase. adaptive: the verify policy
        chose each decode request's window (_choose_windows); masked: and some skip their
        drafter pass."""
        budget, prefilling = self._budget(part, inflight, adaptive)
        updates: list[BlockUpdate] = []
        decodes, did_preempt = self._map(part, updates, preempted)
        prefills = [(r, r.sched_n) for r in prefilling if r.sched_n and r.status == Status.RUNNING]
        if not did_preempt:
            for req, message in self.admission.admit(part, budget, prefills, updates):
                self._report_error(req, message)
        if self.spec_k:
            self._prompt_drafts(prefills)
        if not self.constraints.num_live:
            return partition_step(part, prefills, decodes, updates, masked)
        failed: Failed = []
        pstep, pplan = partition_step(part, prefills, decodes, updates, masked, partial(self.constraints.masks, failed))
        # NOTE: after the plan is built: the row still runs (it is in the plan); update()
        # skips a request that is no longer running, and its pages are freed in the next plan.
        self._fail_in_step(failed)
        return pstep, pplan

    def _prompt_drafts(self, prefills: list[tuple[Request, int]]) -> None:
        """K=7: whether each prompt that completes this step drafts from its first token
        (Request.draft_next, the chunk's `draft`): the verify policy's call for a request
        of its class (drafts_prompt), never where its speculation is off."""
        for r, n in prefills:
            if r.plan_pos + n == r.prefill_target:
                cls = int(request_class(r.sampled, r.constraint is not None))
                r.draft_next = r.max_draft_tokens > 0 and self.policy.drafts_prompt(cls)

    def _budget(self, part: Partition, inflight: int = -1, adaptive: bool = False) -> tuple[int, list[Request]]:
        """Phase 1: ring pages behind the window back, then each running request's rows
        (sched_n) under the token budget: decode rows, then continuing prefill chunks
        (admission order). Returns the budget left and the prefilling requests."""
        budget = self.max_num_batched_tokens
        spec_k = self.spec_k
        verify_n = spec_k + 1
        verify_limit = self.max_model_len - verify_n  # a verify needs num_computed <= this
        prefilling = []
        for req in part.running:
            if req.num_computed >= req.release_pos:
                # NOTE: ring pages behind the window go back here, before any page is mapped
                # (the pools are as if update() had released them), not in update(): a K=7
                # request maps its next ring page 6 positions before its oldest one leaves
                # the window (Flash: 32-token pages, window 128), so a release in update()
                # mostly fell in the same step as the mapping; from here the two meet only
                # when one step accepts 7-8 tokens across both positions.
                part.release_ring(req)
            if inflight < 0:
                req.plan_pos, req.plan_pending = req.num_computed, False
            elif req.plan_pos < 0:  # sits this step out (plan_positions)
                req.sched_n = 0
                continue
            if req.plan_pos < req.prefill_target:
                req.sched_n = 0
                prefilling.append(req)
            elif spec_k and (req.plan_drafts if req.plan_pending else req.has_drafts) and req.plan_pos <= verify_limit:
                n = 1 + req.verify_len if adaptive else verify_n  # 1 + l rows (l = 0: one row)
                if n <= budget:
                    req.sched_n = n
                    budget -= n
                else:
                    req.sched_n = 0
            elif budget > 0:
                req.sched_n = 1
                budget -= 1
            else:
                req.sched_n = 0
        for req in prefilling:
            if budget > 0:
                req.sched_n = min(req.prefill_target - req.plan_pos, self.chunk_cap, budget)
                budget -= req.sched_n
        return budget, prefilling

    def _map(self, part: Partition, updates: list[BlockUpdate], preempted: list[int]) -> tuple[list[Request], bool]:
        """Phase 2: pages for the scheduled rows, oldest request first; on a shortage the
        newest running requests are preempted. Returns the decode requests (still
        running) and whether any request was preempted."""
        num_preempted = len(preempted)
        decodes = []
        # NOTE: iterating while preempting is safe: victims leave from the tail, behind req
        for req in part.running:
            n = req.sched_n
            if not n:
                continue
            end = req.plan_pos + n
            if end > req.map_limit:
                short = part.map(req, end, updates)
                if short is not None and req.plan_pending:
                    # NOTE: planned ahead, req maps for its longest outcome while its ring
                    # pages behind the window are still held (released from num_computed):
                    # it sits this step out rather than preempting anyone (or itself,
                    # again and again, when alone at its capacity peak); the next plan, from
                    # known positions, maps what lockstep would
                    req.sched_n = 0
                    continue
                if short is not None:  # a pool is short: preempt from the tail
                    if not self._preempt_for(part, req, short, preempted):
                        break
                    part.allocate(req, short, updates)
            if req.plan_pos >= req.prefill_target:
                decodes.append(req)
        return decodes, len(preempted) > num_preempted

    def _preempt_for(self, part: Partition, req: Request, counts: list[int], preempted: list[int]) -> bool:
        """Preempt from the tail until counts new pages fit; False when req itself went."""
        while not part.cache.can_allocate(counts):
            victim = part.running[-1]
            part.preempt(victim)
            self.num_preemptions += 1
            preempted.append(victim.req_id)
            if victim is req:
                return False
        return True

    def late_masks(self, step: ScheduledStep) -> StepMasks:
        """The masks the step's plan left out (masks_follow): Constraints.late_masks; a
        request whose constraint fails ends with an error."""
        failed: Failed = []
        per_part = self.constraints.late_masks(step, failed)
        self._fail_in_step(failed)
        return StepMasks(step.step_id, per_part)

    def needs_lockstep(self, inflight: int) -> bool:
        """Whether the next step must wait for step `inflight`'s answer (Constraints)."""
        return self.constraints.needs_lockstep(self.partitions, inflight)

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
        check_live = self._ended_in_step or step.overlapped or bool(self._unanswered)
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

    # ---- finishing ------------------------------------------------------------------------
    def _end(self, req: Request, reason: str) -> None:
        """The one way a live request ends (finish rules, abort, error): its partition
        ends it, the Scheduler forgets it."""
        self.partitions[req.partition].end(req, reason)
        self._forget(req)

    def _forget(self, req: Request) -> None:
        if self.requests.pop(req.request_id, None) is not None:
            if req.constraint is not None:
                self.constraints.num_live -= 1
            if req.max_draft_tokens < DSPARK_K:
                self.num_capped -= 1

    def _fail_in_step(self, failed: Failed) -> None:
        for req, message in failed:
            self._fail(req, message)
            self._ended_in_step = True

    def _fail(self, req: Request, message: str) -> None:
        self._end(req, "error")
        self._report_error(req, message)

    def _report_error(self, req: Request, message: str) -> None:
        """req has ended with an error (Partition.end): forget it, deliver the error."""
        self._forget(req)
        req.error = message
        req.finish_time = time.monotonic()
        self._early_finished.append(req)
        self._early_outputs.append(
            RequestOutput(
                req.request_id,
                [],
                "",
                finished=True,
                finish_reason="error",
                error=message,
                num_prompt_tokens=req.prompt_len,
                num_output_tokens=len(req.output_ids),
                num_cached_tokens=req.num_cached_tokens,
            )
        )
