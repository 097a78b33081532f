"""The scheduler: which rows every partition computes next, and what their results mean.

schedule() and update() are synchronous and pure CPU; the loop owns all I/O.
Request lifecycle: add() -> waiting -> (admitted) running: prefill chunks, then decode
rows -> finished (stop / length / abort / error); running -> waiting again on preemption.
"""

from __future__ import annotations

import time

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.protocol import DSPARK_K, MAX_CHUNK, BlockUpdate, PartitionPlan, PrefillChunk, StepPlan, i32
from dspark_loop.engine.admission import Admission, map_pages
from dspark_loop.engine.finish_rules import FinishRules
from dspark_loop.engine.kv_cache import PartitionCache
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.prefix_cache import PrefixCache
from dspark_loop.engine.request import Request, Status
from dspark_loop.engine.sampling_wire import next_prompt_token
from dspark_loop.engine.scheduled_step import PartitionStep, ScheduledStep, decode_batch
from dspark_loop.engine.spec_counters import SpecCounters
from dspark_loop.engine.step_apply import StepApplier
from dspark_loop.engine.step_update import read_results
from dspark_loop.engine.token_masks import token_masks


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
        self.applier = StepApplier(self.spec, self.prefix, spec_k, self._finish)
        self.requests: dict[str, Request] = {}  # live (waiting or running), by API id
        self._next_step_id = 0
        self._aborted_req_ids: list[int] = []
        self._early_outputs: list[RequestOutput] = []  # finished outside a step (errors)
        self._early_finished: list[Request] = []
        self.num_preemptions = 0
        self._ended_in_step = False  # a scheduled request ended before its results came back
        self.num_constrained = 0  # live requests with a token constraint (output grammars)

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
        part = self.admission.place(self.partitions, req)
        req.partition = part.index
        req.status = Status.WAITING
        part.waiting.append(req)
        self.requests[req.request_id] = req
        if req.constraint is not None:
            self.num_constrained += 1

    def abort(self, request_id: str) -> bool:
        """Finish a live request now ("abort") and free its pages; False if unknown."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        if req.status == Status.RUNNING:
            self._aborted_req_ids.append(req.req_id)
            self._ended_in_step = True
        self.partitions[req.partition].remove(req)
        self._finish(req, "abort")
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
        self.num_constrained = 0
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
    def schedule(self) -> ScheduledStep:
        # Per partition, under a token budget: decode rows first (1, or 8 when verifying
        # drafts), then prefill chunks of running requests, then new admissions, FCFS.
        # Chunks are capped at chunk_cap so a long prompt never starves decodes.
        # Pages are mapped oldest request first; when a pool runs dry the NEWEST running
        # request is preempted by recompute (pages freed, back to the front of the queue,
        # it later re-prefills prompt + outputs and continues with identical tokens).
        # No admissions in a partition that preempted this step: its queue head is the
        # request that was just evicted, and its freed_req_ids must reach the ranks in
        # a plan before any new block update for the same req_id.
        step = ScheduledStep(StepPlan(self._next_step_id, []), [])
        self._ended_in_step = False
        self._next_step_id += 1
        step.aborted_req_ids, self._aborted_req_ids = self._aborted_req_ids, []
        for part in self.partitions:
            pstep, pplan = self._schedule_partition(part, step.preempted_req_ids)
            step.partitions.append(pstep)
            step.plan.partitions.append(pplan)
        return step

    def _schedule_partition(self, part: Partition, preempted: list[int]):
        budget = self.max_num_batched_tokens
        # 1. budget: decode rows, then continuing prefill chunks (admission order)
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
            if req.num_computed < req.prefill_target:
                req.sched_n = 0
                prefilling.append(req)
            elif spec_k and req.has_drafts and req.num_computed <= verify_limit:
                if verify_n <= budget:
                    req.sched_n = verify_n
                    budget -= verify_n
                else:
                    req.sched_n = 0
            elif budget > 0:
                req.sched_n = 1
                budget -= 1
            else:
                req.sched_n = 0
        for req in prefilling:
            if budget > 0:
                req.sched_n = min(req.prefill_target - req.num_computed, self.chunk_cap, budget)
                budget -= req.sched_n
        # 2. pages, oldest first; preempt from the tail on shortage
        updates: list[BlockUpdate] = []
        cache = part.cache
        did_preempt = False
        decodes = []
        # NOTE: iterating while preempting is safe: victims leave from the tail, behind req
        for req in part.running:
            n = req.sched_n
            if not n:
                continue
            end = req.num_computed + n
            if end > req.map_limit:
                grown = cache.grow(req.pages, end)
                if grown is None:  # a pool is short: preempt from the tail
                    counts = cache.num_new_pages(req.pages, end)
                    while not cache.can_allocate(counts):
                        victim = part.running[-1]
                        part.preempt(victim)
                        self.num_preemptions += 1
                        preempted.append(victim.req_id)
                        did_preempt = True
                        if victim is req:
                            break
                    if req.status != Status.RUNNING:
                        break
                    map_pages(cache, req, counts, updates)
                else:
                    for fam, first_page, ids in grown[0]:
                        updates.append(BlockUpdate(req.req_id, fam, first_page, i32(ids)))
                    req.map_limit = grown[1]
            if req.num_computed >= req.prefill_target:
                decodes.append(req)
        pstep = PartitionStep()
        prefills = [(r, r.sched_n) for r in prefilling if r.sched_n and r.status == Status.RUNNING]
        # 3. admissions
        if not did_preempt:
            for req, message in self.admission.admit(part, budget, prefills, updates):
                self._fail(req, message)
        for req, n in prefills:
            start = req.num_computed
            pstep.prefills.append((req, n, start + n == req.prefill_target))
        pplan = PartitionPlan(block_updates=updates)
        pplan.prefills = [
            PrefillChunk(
                r.req_id,
                r.num_computed,
                r.token_bytes(r.num_computed, r.num_computed + n),
                s,
                next_prompt_token(r, r.num_computed + n, s),
            )
            for r, n, s in pstep.prefills
        ]
        failed = []
        if decodes:
            pstep.decode_reqs = decodes
        if self.num_constrained:
            # NOTE: before the tile is built: a verify's forced tokens replace its drafts
            pplan.token_masks, failed = token_masks(pstep, part.drafts if spec_k else None)
        if decodes:
            pplan.decode = decode_batch(decodes, pstep, part.drafts)
        if pstep.is_empty:
            pplan.freed_req_ids = []  # keep them for a plan that is actually sent
        else:
            pplan.freed_req_ids, part.freed_req_ids = part.freed_req_ids, []
        part.take_lease_fields(pplan)  # admissions only happen in a non-empty step
        for req, message in failed:
            # NOTE: the row still runs (it is in the plan); update() skips a request that
            # is no longer running, and its pages are freed in the next plan.
            part.remove(req)
            self._fail(req, message)
            self._ended_in_step = True
        return pstep, pplan

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
        updates = read_results(step, results, self.spec_k, self.max_model_len, self._ended_in_step)
        for part, update in zip(self.partitions, updates):
            self.applier.apply(part, step, update, now, outputs)
        return outputs

    # ---- finishing ------------------------------------------------------------------------
    def _finish(self, req: Request, reason: str) -> None:
        """The caller has taken req out of its partition (Partition.remove)."""
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.map_limit = 0
        if self.requests.pop(req.request_id, None) is not None and req.constraint is not None:
            self.num_constrained -= 1

    def _fail(self, req: Request, message: str) -> None:
        self._finish(req, "error")
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
