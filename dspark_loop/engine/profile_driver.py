"""ProfileDriver: the start-up profile's dummy decode steps, run through the real mesh before
the server takes requests (docs/architecture.md, "What it measures").

It drives a throwaway Scheduler (built by the caller over the mesh's pages, with a
profile_plan.ProfilePolicy) in lockstep: dummy requests (a short prompt,
ignore_eos) are admitted like any request, so pages, leases and block tables are what the
scheduler always writes, through its one writer per state (each Partition). Per load,
largest first: each partition keeps that many dummy requests (the newest end, or new ones
join and prefill; those steps are not timed), then `repeats` rounds of the profile's
cells; the policy keeps each decode step's cost (feedback.step_cost_s, as the served steps
are measured). At the end every dummy request ends and one last plan tells the ranks to
forget their ids and scrub every drafter lease, so the server's own scheduler (fresh pools,
leases and prefix cache; stale page contents are never read: a step writes every row
before anything gathers it) starts on ranks that hold nothing of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dspark_loop.contract.protocol import PartitionPlan, StepPlan, i32
from dspark_loop.engine.capacity import peak_pages
from dspark_loop.engine.interfaces import MeshClient
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.profile_plan import PROFILE_REPEATS, ROUND, ProfilePolicy, profile_loads
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduler import Scheduler

log = logging.getLogger("dspark_loop")

# The dummy requests' prompt: a few ordinary tokens (any ids the vocabulary has).
PROMPT_LEN = 8
# The output tokens a dummy request may decode before it ends (and another takes its seat):
# enough for a few loads' rounds, short enough that many fit the pages.
MAX_DUMMY_TOKENS = 512
MAX_SETTLE_STEPS = 16  # steps a load may take to have its requests decoding (prefills, top-ups)


class ProfileDriver:
    def __init__(
        self,
        scheduler: Scheduler,
        policy: ProfilePolicy,
        mesh: MeshClient,
        num_blocks: list[int],
        *,
        overlapped: bool,
        max_tokens: int,
    ):
        """num_blocks: pages per family of a partition; overlapped: the server plans ahead, so a
        step's cost is the ranks' work alone (the host's CPU time is added in lockstep);
        max_tokens: each dummy request's outputs (capped to the context)."""
        self.sched, self.policy, self.mesh = scheduler, policy, mesh
        self.num_blocks = num_blocks
        self.overlapped = overlapped
        self.max_tokens = min(max_tokens, scheduler.max_model_len - PROMPT_LEN)
        self.released = False  # the ranks were told to forget every dummy request
        self.mine: list[Request] = []  # every dummy request admitted, oldest first
        self.wire_ids: set[int] = set()  # every req_id a plan told the ranks about
        self.last_step_id = -1
        self.num_steps = 0
        self.num_dummies = 0

    def loads(self) -> list[int]:
        """The loads to profile: up to the seats of a partition, as many as its pages hold
        (each dummy request at its peak); none when the context has no room for a prompt."""
        s = self.sched
        if self.max_tokens < 1:
            return []
        need = peak_pages(
            s.layout, PROMPT_LEN, self.max_tokens, max_model_len=s.max_model_len, chunk_cap=s.chunk_cap, spec_k=s.spec_k
        )
        fit = min(have // max(n, 1) for have, n in zip(self.num_blocks, need))
        return profile_loads(min(s.max_seqs_per_partition, fit)) if fit else []

    async def run(self, loads: list[int], repeats: int = PROFILE_REPEATS, progress: Callable | None = None) -> None:
        """Each load's rounds (loads: decode requests per partition, largest first); progress(n)
        after each load."""
        try:
            for n in loads:
                if not await self.settle(n):
                    log.warning("verify profile: %d requests per partition did not settle; skipped", n)
                    continue
                for _ in range(repeats):
                    for cell in ROUND:
                        self.policy.cell = cell
                        await self.step()
                if progress is not None:
                    progress(n)
        finally:
            await self.release()

    async def settle(self, n: int) -> bool:
        """Until every partition decodes exactly n dummy requests (no prompt rows): end the
        newest beyond n, add new ones, run (untimed-shape) steps; False if it never did."""
        for _ in range(MAX_SETTLE_STEPS):
            self.fill(n)
            last = self.policy.last
            if last is not None and not last.prompt_rows.any() and (last.num_requests == n).all():
                return True
            self.policy.cell = (True, 0)  # the step drafts: the rounds' first cell has drafts
            await self.step()
        return False

    def fill(self, n: int) -> None:
        """n live dummy requests per partition: the newest beyond n end, new ones are added."""
        live = [r for r in self.mine if r.request_id in self.sched.requests]
        per_part: dict[int, list[Request]] = {}
        for r in live:
            per_part.setdefault(r.partition, []).append(r)
        for reqs in per_part.values():
            for r in reqs[n:]:
                self.sched.abort(r.request_id)
        kept = sum(min(len(reqs), n) for reqs in per_part.values())
        for _ in range(n * len(self.sched.partitions) - kept):
            self.add()

    def add(self) -> None:
        params = SamplingParams(max_tokens=self.max_tokens, ignore_eos=True)
        prompt = [1 + k for k in range(PROMPT_LEN)]
        req = self.sched.make_request(GenerateRequest(f"verify-profile-{self.num_dummies}", prompt, params))
        self.num_dummies += 1
        self.sched.add(req)
        self.mine.append(req)

    async def step(self) -> None:
        """One lockstep step: plan, send, gather, apply, and its cost to the policy."""
        sched = self.sched
        t0, cpu0 = time.perf_counter(), time.thread_time()
        step = sched.schedule()
        if step.is_empty:
            sched.update(step, [])
            return
        for part in step.plan.partitions:
            self.wire_ids.update(u.req_id for u in part.block_updates)
            self.wire_ids.update(c.req_id for c in part.prefills)
        self.last_step_id = step.step_id
        results = await self.mesh.step(step.plan)
        wall_s = time.perf_counter() - t0
        sched.update(step, results)
        host_s = None if self.overlapped else time.thread_time() - cpu0
        sched.observe_step(step, results, wall_s, host_s, self.overlapped)
        self.num_steps += 1

    async def release(self) -> None:
        """End every dummy request; the ranks forget their ids and scrub every lease."""
        for r in self.mine:
            self.sched.abort(r.request_id)
        if not self.wire_ids:
            self.released = True
            return
        ids = sorted(self.wire_ids)
        leases = i32(list(range(self.sched.max_seqs_per_partition if self.sched.spec_k else 0)))
        parts = [PartitionPlan(freed_req_ids=ids, scrub_lease_ids=leases) for _ in self.sched.partitions]
        await self.mesh.step(StepPlan(self.last_step_id + 1, parts))
        self.released = True
