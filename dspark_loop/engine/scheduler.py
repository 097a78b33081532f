"""The scheduler: which rows every partition computes next, and what their results mean.

schedule() and update() are synchronous and pure CPU; the loop owns all I/O.
Request lifecycle: add() -> waiting -> (admitted) running: prefill chunks, then decode
rows -> finished (stop / length / abort / error); running -> waiting again on preemption.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from dspark_loop.cache_layout import CacheLayout
from dspark_loop.engine.acceptance import FinishRules
from dspark_loop.engine.kv_cache import PartitionCache
from dspark_loop.engine.leases import LeasePool
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput
from dspark_loop.engine.prefix_cache import PrefixCache, stop_registering
from dspark_loop.engine.request import Request, Status
from dspark_loop.engine.spec_counters import SpecCounters
from dspark_loop.engine.scheduled_step import PartitionStep, ScheduledStep, decode_batch
from dspark_loop.engine.step_update import apply_results
from dspark_loop.engine.token_masks import token_masks
from dspark_loop.config import MAX_CHUNK
from dspark_loop.protocol import DSPARK_K, BlockUpdate, PartitionPlan, PrefillChunk, StepPlan, i32


class Partition:
    """One TP group's share: its page pools, running requests (admission order) and queue."""

    def __init__(self, index: int, cache: PartitionCache):
        self.index = index
        self.cache = cache
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.freed_req_ids: list[int] = []  # for the next plan
        self.leases: LeasePool | None = None  # K=7 drafter leases
        self.new_leases: list[tuple[int, int]] = []  # (req_id, lease) for the next plan
        self.scrub_lease_ids: list[int] = []

    @property
    def num_requests(self) -> int:
        return len(self.running) + len(self.waiting)


class Scheduler:
    def __init__(self, layout: CacheLayout, num_partitions: int, num_blocks: list[int],
                 max_num_seqs: int, max_num_batched_tokens: int,
                 long_prefill_token_threshold: int, max_model_len: int,
                 eos_token_ids, spec_k: int = 0, enable_prefix_caching: bool = True):
        if spec_k not in (0, DSPARK_K):
            raise ValueError(f"spec_k must be 0 or {DSPARK_K} (the verify tile is {DSPARK_K + 1} rows), "
                             f"got {spec_k}")
        if max_num_seqs < num_partitions:
            raise ValueError(f"max_num_seqs {max_num_seqs} < {num_partitions} partitions")
        self.layout = layout
        self.partitions = [Partition(p, PartitionCache(layout, list(num_blocks)))
                           for p in range(num_partitions)]
        self.max_seqs_per_partition = max_num_seqs // num_partitions
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunk_cap = min(MAX_CHUNK, max_num_batched_tokens,
                             long_prefill_token_threshold or max_num_batched_tokens)
        self.max_model_len = max_model_len
        self.eos_token_ids = tuple(int(e) for e in eos_token_ids)
        self.spec_k = spec_k
        self.prefix = PrefixCache(layout, spec_k) if enable_prefix_caching else None
        self.requests: dict[str, Request] = {}  # live (waiting or running), by API id
        self._next_req_id = 0
        self._next_step_id = 0
        self._aborted_req_ids: list[int] = []
        self._early_outputs: list[RequestOutput] = []  # finished outside a step (errors)
        self._early_finished: list[Request] = []
        self.num_preemptions = 0
        self.spec = SpecCounters()
        if spec_k:
            for part in self.partitions:
                part.leases = LeasePool(self.max_seqs_per_partition)

    # ---- intake -----------------------------------------------------------------------
    def make_request(self, g: GenerateRequest, detokenizer=None) -> Request:
        """Validate and cap a GenerateRequest; raises ValueError for what can never run."""
        prompt_len = len(g.prompt_token_ids)
        if prompt_len == 0:
            raise ValueError("the prompt is empty")
        if prompt_len >= self.max_model_len:
            raise ValueError(f"the prompt has {prompt_len} tokens; the context is "
                             f"{self.max_model_len} tokens including at least one output token")
        p = g.params
        if p.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {p.max_tokens}")
        rules = FinishRules(eos_token_ids=self.eos_token_ids,
                            stop_token_ids=tuple(int(t) for t in p.stop_token_ids),
                            ignore_eos=p.ignore_eos, min_tokens=p.min_tokens,
                            max_tokens=min(p.max_tokens, self.max_model_len - prompt_len),
                            max_model_len=self.max_model_len)
        req = Request(g.request_id, g.prompt_token_ids, p, rules,
                      detokenizer, g.arrival_time or time.monotonic())
        req.constraint = g.constraint
        return req

    def add(self, req: Request) -> None:
        if req.prompt_len >= self.max_model_len or req.prompt_len == 0:
            raise ValueError(f"prompt of {req.prompt_len} tokens does not fit the context "
                             f"of {self.max_model_len}")
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        # NOTE: the longest prefix hit picks the partition (its pages live there only);
        # ties and misses go to the partition with the fewest requests.
        if self.prefix is None:
            part = min(self.partitions, key=lambda p: (p.num_requests, p.index))
        else:
            part = min(self.partitions, key=lambda p: (-self.prefix.hit_len(p.cache, req),
                                                       p.num_requests, p.index))
        req.partition = part.index
        req.status = Status.WAITING
        part.waiting.append(req)
        self.requests[req.request_id] = req

    def abort(self, request_id: str) -> bool:
        """Finish a live request now ("abort") and free its pages; False if unknown."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        part = self.partitions[req.partition]
        if req.status == Status.WAITING:
            part.waiting.remove(req)
        else:
            part.running.remove(req)
        if req.status == Status.RUNNING:
            self._aborted_req_ids.append(req.req_id)
        self._finish(req, "abort")
        req.finish_time = time.monotonic()
        self._early_finished.append(req)  # observers see it with the next update
        return True

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
            for r in part.waiting:
                if any(fp.block_ids for fp in r.pages):
                    raise AssertionError(f"waiting {r} holds pages")
            part.cache.check_integrity([r.pages for r in part.running])
            if part.leases is not None:
                part.leases.check_integrity({r.lease: r.req_id for r in part.running})

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
        self._next_step_id += 1
        step.aborted_req_ids, self._aborted_req_ids = self._aborted_req_ids, []
        for part in self.partitions:
            pstep, pplan = self._schedule_partition(part, step.preempted_req_ids)
            step.partitions.append(pstep)
            step.plan.partitions.append(pplan)
        return step

    def _schedule_partition(self, part: Partition, preempted: list[int]):
        budget = self.max_num_batched_tokens
        decode_limit = self.max_model_len
        # 1. budget: decode rows, then continuing prefill chunks (admission order)
        for req in part.running:
            req.sched_n = 0
            if req.is_prefilling:
                continue
            k = 1
            if self.spec_k and req.draft_ids is not None and req.constraint is None \
                    and req.num_computed + self.spec_k + 1 <= decode_limit:
                k = self.spec_k + 1
            if k <= budget:
                req.sched_n = k
                budget -= k
        for req in part.running:
            if req.is_prefilling and budget > 0:
                req.sched_n = min(req.prefill_target - req.num_computed, self.chunk_cap, budget)
                budget -= req.sched_n
        # 2. pages, oldest first; preempt from the tail on shortage
        updates: list[BlockUpdate] = []
        cache = part.cache
        did_preempt = False
        i = 0
        while i < len(part.running):
            req = part.running[i]
            end = req.num_computed + req.sched_n
            if req.sched_n and end > req.map_limit:
                counts = cache.num_new_pages(req.pages, end)
                while not cache.can_allocate(counts):
                    victim = part.running[-1]
                    self._preempt(part, victim)
                    preempted.append(victim.req_id)
                    did_preempt = True
                    if victim is req:
                        break
                if req.status != Status.RUNNING:
                    break
                self._map(cache, req, counts, updates)
            i += 1
        pstep = PartitionStep()
        prefills = [(r, r.sched_n) for r in part.running if r.sched_n and r.is_prefilling]
        decodes = [r for r in part.running if r.sched_n and not r.is_prefilling]
        # 3. admissions
        if not did_preempt:
            self._admit(part, budget, prefills, updates)
        for req, n in prefills:
            start = req.num_computed
            pstep.prefills.append((req, n, start + n == req.prefill_target))
        pplan = PartitionPlan(block_updates=updates)
        pplan.prefills = [PrefillChunk(r.req_id, r.num_computed, i32(r.token_slice(r.num_computed, r.num_computed + n)), s)
                          for r, n, s in pstep.prefills]
        if decodes:
            pstep.decode_reqs = decodes
            pplan.decode = decode_batch(decodes, pstep)
        if pstep.is_empty:
            pplan.freed_req_ids = []  # keep them for a plan that is actually sent
        else:
            pplan.freed_req_ids, part.freed_req_ids = part.freed_req_ids, []
        if part.new_leases:  # admissions only happen in a non-empty step
            pplan.lease_req_ids = i32([r for r, _ in part.new_leases])
            pplan.lease_ids = i32([lease for _, lease in part.new_leases])
            pplan.scrub_lease_ids = i32(part.scrub_lease_ids)
            part.new_leases, part.scrub_lease_ids = [], []
        pplan.token_masks = token_masks(self, part, pstep)  # after the frees: may fail a request
        return pstep, pplan

    def _admit(self, part: Partition, budget: int, prefills: list, updates: list) -> None:
        cache = part.cache
        while part.waiting and budget > 0 and len(part.running) < self.max_seqs_per_partition:
            req = part.waiting[0]
            hit = self.prefix.find(cache, req) if self.prefix is not None else None
            start = hit.num_tokens if hit else 0
            n = min(req.num_tokens - start, self.chunk_cap, budget)
            req.pages = hit.pages if hit else cache.new_pages()
            counts = cache.num_new_pages(req.pages, start + n)
            if not cache.can_allocate(counts, req.pages if hit else None):
                req.pages = []
                if part.running:
                    return  # wait for pages to come back
                # NOTE: alone in an empty partition and still no room: it can never run.
                part.waiting.popleft()
                self._fail(req, f"the request needs more cache pages than the partition has "
                                f"({counts} new pages, {cache.num_free()} free)")
                continue
            part.waiting.popleft()
            # NOTE: a fresh wire id per admission: a preempted request's old id may still
            # sit in freed_req_ids of a plan not sent yet, and the ranks must never see
            # block updates and a free for the same id in one plan.
            req.req_id = self._next_req_id
            self._next_req_id += 1
            req.status = Status.RUNNING
            req.num_computed = start
            req.prefill_target = req.num_tokens
            if req.num_preemptions == 0:
                req.num_cached_tokens = start
            part.running.append(req)
            if part.leases is not None:
                self._take_lease(part, req)
            if hit:
                cache.share(req.pages)
                updates += [BlockUpdate(req.req_id, f, fp.first_page, i32(fp.block_ids))
                            for f, fp in enumerate(req.pages) if fp.block_ids]
            if self.prefix is not None:
                self.prefix.start(req, start)
            self._map(cache, req, counts, updates)
            req.sched_n = n
            prefills.append((req, n))
            budget -= n

    def _map(self, cache: PartitionCache, req: Request, counts: list[int], updates: list) -> None:
        for fam, first_page, ids in cache.allocate(req.pages, counts):
            updates.append(BlockUpdate(req.req_id, fam, first_page, i32(ids)))
        req.map_limit = cache.map_limit(req.pages)

    # ---- step 5 -----------------------------------------------------------------------
    def update(self, step: ScheduledStep, results, now: float | None = None) -> list[RequestOutput]:
        """results: one leader StepResult per partition, in partition order."""
        now = time.monotonic() if now is None else now
        outputs, self._early_outputs = self._early_outputs, []
        step.finished.extend(self._early_finished)
        self._early_finished = []
        if not step.is_empty:
            apply_results(self, step, results, outputs, now)
        return outputs

    # ---- transitions --------------------------------------------------------------------
    def _take_lease(self, part: Partition, req: Request) -> None:
        req.lease = part.leases.take(req.req_id)
        part.new_leases.append((req.req_id, req.lease))
        if req.num_preemptions:
            # NOTE: a re-admitted request must not read its old incarnation's ring rows
            part.scrub_lease_ids.append(req.lease)
            self.spec.num_lease_scrubs += 1

    def _free_lease(self, part: Partition, req: Request) -> None:
        if req.lease >= 0:
            part.leases.free(req.lease)
            req.lease = -1
        req.draft_ids = None

    def _preempt(self, part: Partition, req: Request) -> None:
        part.running.remove(req)
        part.cache.free(req.pages)
        req.map_limit = 0
        req.release_pos = 0
        req.num_computed = 0
        req.prefill_target = 0
        self._free_lease(part, req)
        req.sched_n = 0
        stop_registering(req)
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        part.freed_req_ids.append(req.req_id)
        part.waiting.appendleft(req)

    def _finish(self, req: Request, reason: str) -> None:
        """The caller has taken req out of running/waiting."""
        part = self.partitions[req.partition]
        if req.status == Status.RUNNING:
            part.cache.free(req.pages)
            part.freed_req_ids.append(req.req_id)
            self._free_lease(part, req)
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.map_limit = 0
        self.requests.pop(req.request_id, None)

    def _fail(self, req: Request, message: str) -> None:
        self._finish(req, "error")
        req.error = message
        req.finish_time = time.monotonic()
        self._early_finished.append(req)
        self._early_outputs.append(RequestOutput(
            req.request_id, [], "", finished=True, finish_reason="error", error=message,
            num_prompt_tokens=req.prompt_len, num_output_tokens=len(req.output_ids),
            num_cached_tokens=req.num_cached_tokens))
