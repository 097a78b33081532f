"""Partition: one TP group's share of the engine -- its page pools, its running requests
(admission order) and queue, and (K=7) its drafter leases -- and the owner of its
requests' state. The Scheduler and its managers (Admission, StepApplier) decide; a
Partition applies, through its named transitions:

    admit    waiting -> running   (queue head to running, positions cached so far)
    plan     running             (where its next rows start: plan_pos, plan_pending, ...;
                                  plan_at_computed in lockstep)
    assign_rows / sit_out         (its rows this step: sched_n)
    set/store/drop_drafts        (the draft table, has_drafts)
    map      running             (pages for positions < end; map_limit)
    advance  running             (positions computed; num_computed)
    preempt  running -> waiting   (pages and lease back, front of the queue)
    end      waiting|running -> finished (pages and lease back)

NOTE: these are the only writers of a request's status, num_computed, map_limit, plan_*,
sched_n, has_drafts and of the draft table (tests/unit/engine/test_request_state.py scans
the code for others).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K, BlockUpdate, PartitionPlan, SamplingSpec, i32
from dspark_loop.engine.kv_cache import PartitionCache
from dspark_loop.engine.leases import LeasePool
from dspark_loop.engine.prefix_cache import stop_registering
from dspark_loop.engine.request import Request, Status


class Partition:
    def __init__(self, index: int, cache: PartitionCache, num_leases: int = 0):
        self.index = index
        self.cache = cache
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.freed_req_ids: list[int] = []  # for the next plan
        self.leases = LeasePool(num_leases) if num_leases else None  # K=7 drafter leases
        # K=7: each lease holder's pending drafts (valid while its has_drafts is set); a
        # table, not a list per request: a step stores and reads them with one numpy call
        self.drafts = np.zeros((num_leases, DSPARK_K), np.int32) if num_leases else None  # [L, K]
        # ... and the drafter's confidence in each (what a verify policy chooses from)
        self.conf = np.zeros((num_leases, DSPARK_K), np.float32) if num_leases else None  # [L, K]
        self.new_leases: list[tuple[int, int]] = []  # (req_id, lease) for the next plan
        self.scrub_lease_ids: list[int] = []
        self.new_sampling: list[SamplingSpec] = []  # specs of requests admitted since the last plan

    @property
    def num_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    # ---- leases (K=7) ---------------------------------------------------------------------
    def take_lease(self, req: Request) -> bool:
        """Give an admitted request a lease; True when the ranks must scrub it first."""
        assert self.leases is not None, "a K=0 partition has no leases"
        req.lease = self.leases.take(req.req_id)
        self.new_leases.append((req.req_id, req.lease))
        if req.num_preemptions:
            # NOTE: a re-admitted request must not read its old incarnation's ring rows
            self.scrub_lease_ids.append(req.lease)
            return True
        return False

    def set_drafts(self, req: Request, drafts, conf=None) -> None:
        """The ranks' (or a test's) drafts [K] for req's next anchor, and their confidences
        [K] (None: 1.0 each)."""
        if req.lease < 0:
            raise ValueError(f"{req} holds no drafter lease (K=7 running requests only)")
        assert self.drafts is not None and self.conf is not None  # a lease implies the K=7 draft table
        self.drafts[req.lease] = drafts
        self.conf[req.lease] = 1.0 if conf is None else conf
        req.has_drafts = True

    def store_drafts(self, reqs: list[Request], leases, drafts: np.ndarray, conf=None) -> None:
        """The ranks' next drafts [n, K] for reqs (their leases [n]), and their confidences
        ([n, K]; None: 1.0 each)."""
        assert self.drafts is not None and self.conf is not None  # drafts come only to K=7 partitions
        self.drafts[leases] = drafts
        self.conf[leases] = 1.0 if conf is None else conf
        for req in reqs:
            req.has_drafts = True

    def drop_drafts(self, reqs) -> None:
        """reqs hold no drafts for their next anchor (spent, or their drafter pass skipped)."""
        for req in reqs:
            req.has_drafts = False

    def free_lease(self, req: Request) -> None:
        if req.lease >= 0:
            assert self.leases is not None  # a lease implies the K=7 pool
            self.leases.free(req.lease)
            req.lease = -1
        req.has_drafts = False

    def take_lease_fields(self, pplan: PartitionPlan) -> None:
        """Move the leases and sampling specs given since the last plan into pplan (a
        non-empty plan: admissions only happen in one)."""
        if self.new_sampling:
            pplan.sampling, self.new_sampling = self.new_sampling, []
        if self.new_leases:
            pplan.lease_req_ids = i32([r for r, _ in self.new_leases])
            pplan.lease_ids = i32([lease for _, lease in self.new_leases])
            pplan.scrub_lease_ids = i32(self.scrub_lease_ids)
            self.new_leases, self.scrub_lease_ids = [], []

    # ---- pages -------------------------------------------------------------------------
    def release_ring(self, req: Request) -> None:
        """Give back swa ring pages req has moved past."""
        if req.num_computed >= req.release_pos:
            req.release_pos = self.cache.release_behind(req.pages, req.num_computed)

    def map(self, req: Request, end: int, updates: list[BlockUpdate]) -> list[int] | None:
        """Map req's pages for positions < end (a running request growing); None when
        mapped, else the new pages per family that a pool is short of (nothing changed:
        the caller preempts, then calls allocate)."""
        grown = self.cache.grow(req.pages, end)
        if grown is None:
            return self.cache.num_new_pages(req.pages, end)
        for fam, first_page, ids in grown[0]:
            updates.append(BlockUpdate(req.req_id, fam, first_page, i32(ids)))
        req.map_limit = grown[1]
        return None

    def allocate(self, req: Request, counts: list[int], updates: list[BlockUpdate]) -> None:
        """Allocate req's new pages (counts per family; can_allocate said yes) and record
        the block updates."""
        for fam, first_page, ids in self.cache.allocate(req.pages, counts):
            updates.append(BlockUpdate(req.req_id, fam, first_page, i32(ids)))
        req.map_limit = self.cache.map_limit(req.pages)

    # ---- transitions ----------------------------------------------------------------------
    def admit(self, req: Request, start: int, n: int) -> None:
        """The queue head starts running with positions < start cached (a prefix hit, or 0)
        and a first chunk of n; its pages and wire id are set, its first chunk's pages are
        mapped next (allocate)."""
        if self.waiting[0] is not req:
            raise AssertionError(f"{req} is not the head of partition {self.index}'s queue")
        self.waiting.popleft()
        req.status = Status.RUNNING
        req.num_computed = start
        req.prefill_target = req.num_tokens
        req.plan_pos, req.plan_pending = start, False
        req.sched_n = n
        self.running.append(req)

    def plan(self, starts: list[tuple[int, bool, bool, bool]]) -> None:
        """Where each running request's next rows start (step_start.py decided):
        (plan_pos, plan_pending, plan_open, plan_drafts) per request, in running order."""
        for req, (pos, pending, opened, drafts) in zip(self.running, starts):
            req.plan_pos, req.plan_pending, req.plan_open, req.plan_drafts = pos, pending, opened, drafts

    def plan_at_computed(self) -> None:
        """plan() in lockstep: every running request starts at num_computed, nothing pending."""
        for req in self.running:
            req.plan_pos, req.plan_pending, req.plan_open, req.plan_drafts = req.num_computed, False, False, False

    def assign_rows(self, rows: list[int]) -> None:
        """The rows each running request computes this step (row_budget.py decided)."""
        for req, n in zip(self.running, rows):
            req.sched_n = n

    def sit_out(self, req: Request) -> None:
        """req computes nothing this step after all (its pages could not be mapped)."""
        req.sched_n = 0

    def advance(self, req: Request, n: int) -> None:
        """n more of req's positions have their KV in the cache."""
        req.num_computed += n

    def advance_all(self, reqs: list[Request], lens: list[int]) -> None:
        """advance() for a step's decode requests (one loop, no call per request)."""
        for req, n in zip(reqs, lens):
            req.num_computed += n

    def preempt(self, req: Request) -> None:
        """Recompute later: pages and lease back, to the front of the queue."""
        self.running.remove(req)
        self.cache.free(req.pages)
        req.map_limit = 0
        req.release_pos = 0
        req.num_computed = 0
        req.prefill_target = 0
        # NOTE: its unanswered rows are dropped: update() skips a waiting request, and step_start
        # matches in-flight rows by wire id (admission gives it a new one)
        self.free_lease(req)
        req.sched_n = 0
        stop_registering(req)
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.freed_req_ids.append(req.req_id)
        self.waiting.appendleft(req)

    def end(self, req: Request, reason: str) -> None:
        """req finished (stop / length / abort / error): out of running or the queue; a
        running one gives its pages and lease back."""
        if req.status == Status.WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
            self.cache.free(req.pages)
            self.freed_req_ids.append(req.req_id)
            self.free_lease(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.map_limit = 0

    def check_integrity(self) -> None:
        for r in self.waiting:
            if any(fp.block_ids for fp in r.pages):
                raise AssertionError(f"waiting {r} holds pages")
        self.cache.check_integrity([r.pages for r in self.running])
        if self.leases is not None:
            self.leases.check_integrity({r.lease: r.req_id for r in self.running})
