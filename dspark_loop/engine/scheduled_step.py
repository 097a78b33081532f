"""What schedule() decided for one step: the wire plan plus what update() needs to read
the results back (which request each sampled token belongs to)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.engine.request import Request
from dspark_loop.protocol import DSPARK_K, DecodeBatch, StepPlan


@dataclass
class PartitionStep:
    # (request, num_tokens, sample) per prefill chunk, in plan order
    prefills: list[tuple[Request, int, bool]] = field(default_factory=list)
    decode_reqs: list[Request] = field(default_factory=list)
    decode_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # [R]
    decode_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [R] row 0's position
    decode_req_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # [R]
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


def decode_batch(decodes: list[Request], pstep: PartitionStep) -> DecodeBatch:
    """The wire DecodeBatch: row 0 = last token, rows 1.. = drafts when verifying."""
    n = len(decodes)
    rows = np.fromiter([r.sched_n for r in decodes], np.int8, n)  # [R]
    start = np.fromiter([r.num_computed for r in decodes], np.int64, n)  # [R]
    req_ids = np.fromiter([r.req_id for r in decodes], np.int32, n)  # [R]
    if rows.max() == 1:
        tokens = np.fromiter([r.output_ids[-1] for r in decodes], np.int32, n)  # [R]
    else:
        flat = []
        for r in decodes:
            flat.append(r.output_ids[-1])
            if r.sched_n > 1:
                flat.extend(r.draft_ids)
        tokens = np.array(flat, np.int32)  # [sum(rows)]
        k = DSPARK_K
        if rows.min() > 1:  # every request verifies: [R, K+1] rows
            pstep.verify_drafts = tokens.reshape(n, k + 1)[:, 1:]  # [R, K]
        else:
            rows64 = rows.astype(np.int64)
            first = np.cumsum(rows64) - rows64  # [R] each request's first row
            pstep.verify_drafts = tokens[first[rows > 1, None] + np.arange(1, k + 1)]  # [V, K]
    pstep.decode_rows = rows
    pstep.decode_start = start
    pstep.decode_req_ids = req_ids
    return DecodeBatch(
        req_ids=req_ids.tobytes(),
        start_pos=start.astype(np.int32).tobytes(),
        num_rows=rows.tobytes(),
        token_ids=tokens.tobytes(),
    )
