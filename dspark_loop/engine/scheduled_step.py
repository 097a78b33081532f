"""What schedule() decided for one step: the wire plan plus what update() needs to read
the results back (which request each sampled token belongs to)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K, BlockUpdate, DecodeBatch, PartitionPlan, PrefillChunk, StepPlan
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request
from dspark_loop.engine.sampling_wire import next_prompt_token


@dataclass
class PartitionStep:
    # (request, num_tokens, sample) per prefill chunk, in plan order
    prefills: list[tuple[Request, int, bool]] = field(default_factory=list)
    decode_reqs: list[Request] = field(default_factory=list)
    decode_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # [R]
    decode_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [R] row 0's position
    decode_req_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [R]
    decode_leases: np.ndarray | None = None  # [R] K=7: the requests' drafter leases (draft table rows)
    verify_drafts: np.ndarray | None = None  # [V, K] the drafts of the requests with rows > 1

    @property
    def num_sampled(self) -> int:
        """Tokens the TP leader must answer with."""
        return sum(1 for _, _, s in self.prefills if s) + int(self.decode_rows.sum())

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decode_reqs


@dataclass
class ScheduledStep:
    plan: StepPlan
    partitions: list[PartitionStep]
    preempted_req_ids: list[int] = field(default_factory=list)
    aborted_req_ids: list[int] = field(default_factory=list)  # since the previous plan
    # filled by update()
    finished: list[Request] = field(default_factory=list)
    accepted_req_ids: list[int] = field(default_factory=list)
    accepted_lens: list[int] = field(default_factory=list)
    accepted_num_drafts: list[int] = field(default_factory=list)  # per accepted_lens: 7 or 0
    num_new_tokens: int = 0

    @property
    def step_id(self) -> int:
        return self.plan.step_id

    @property
    def is_empty(self) -> bool:
        return all(p.is_empty for p in self.partitions)


def decode_batch(decodes: list[Request], pstep: PartitionStep, drafts: np.ndarray | None = None) -> DecodeBatch:
    """The wire DecodeBatch: row 0 = last token, rows 1.. = drafts when verifying.
    drafts: the partition's draft table [L, K] (K=7), read at each verifying request's lease."""
    n = len(decodes)
    rows = np.fromiter([r.sched_n for r in decodes], np.int8, n)  # [R]
    start = np.fromiter([r.num_computed for r in decodes], np.int64, n)  # [R]
    req_ids = np.fromiter([r.req_id for r in decodes], np.int32, n)  # [R]
    last = np.fromiter([r.output_ids[-1] for r in decodes], np.int32, n)  # [R] row 0
    leases = None if drafts is None else np.fromiter([r.lease for r in decodes], np.int64, n)  # [R]
    if rows.max() == 1:
        tokens = last
    else:
        k = DSPARK_K
        if rows.min() > 1:  # every request verifies: [R, K+1] rows
            tile = np.empty((n, k + 1), np.int32)
            tile[:, 0] = last
            tile[:, 1:] = drafts[leases]
            tokens = tile.reshape(-1)  # [R * (K+1)]
            pstep.verify_drafts = tile[:, 1:]  # [R, K]
        else:
            verify = rows > 1  # [R]
            rows64 = rows.astype(np.int64)
            first = np.cumsum(rows64) - rows64  # [R] each request's first row
            tokens = np.empty(int(rows64.sum()), np.int32)  # [sum(rows)]
            tokens[first] = last
            vd = drafts[leases[verify]]  # [V, K]
            tokens[first[verify, None] + np.arange(1, k + 1)] = vd
            pstep.verify_drafts = vd
    pstep.decode_rows = rows
    pstep.decode_start = start
    pstep.decode_req_ids = req_ids
    pstep.decode_leases = leases
    return DecodeBatch(
        req_ids=req_ids.tobytes(),
        start_pos=start.astype(np.int32).tobytes(),
        num_rows=rows.tobytes(),
        token_ids=tokens.tobytes(),
    )


def partition_step(
    part: Partition, prefills: list[tuple[Request, int]], decodes: list[Request], updates: list[BlockUpdate]
) -> tuple[PartitionStep, PartitionPlan]:
    """Phase 4 of Scheduler.schedule: a partition's PartitionStep (what the results will
    mean) and its wire plan; the freed ids and new leases since the last sent plan go in."""
    pstep = PartitionStep()
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
    if decodes:
        pstep.decode_reqs = decodes
        pplan.decode = decode_batch(decodes, pstep, part.drafts)
    if pstep.is_empty:
        pplan.freed_req_ids = []  # keep them for a plan that is actually sent
    else:
        pplan.freed_req_ids, part.freed_req_ids = part.freed_req_ids, []
    part.take_lease_fields(pplan)  # admissions only happen in a non-empty step
    return pstep, pplan
