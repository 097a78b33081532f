"""What schedule() decided for one step: the wire plan plus what update() needs to read
the results back (which request each sampled token belongs to)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.engine.request import Request
from dspark_loop.protocol import DecodeBatch, StepPlan


@dataclass
class PartitionStep:
    # (request, num_tokens, sample) per prefill chunk, in plan order
    prefills: list[tuple[Request, int, bool]] = field(default_factory=list)
    decode_reqs: list[Request] = field(default_factory=list)
    decode_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # [R]
    decode_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [R] row 0's position
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
    last = np.fromiter([r.output_ids[-1] for r in decodes], np.int32, n)  # [R]
    start = np.fromiter([r.num_computed for r in decodes], np.int64, n)  # [R]
    req_ids = np.fromiter([r.req_id for r in decodes], np.int32, n)  # [R]
    if rows.max() == 1:
        tokens = last  # [R]
    else:
        rows64 = rows.astype(np.int64)
        starts = np.cumsum(rows64) - rows64  # [R] first row of each request
        tokens = np.empty(int(rows64.sum()), np.int32)  # [sum(rows)]
        tokens[starts] = last
        verify = np.flatnonzero(rows > 1)
        drafts = np.stack([decodes[j].draft_ids for j in verify.tolist()])  # [V, K]
        tokens[starts[verify, None] + np.arange(1, drafts.shape[1] + 1)] = drafts
        pstep.verify_drafts = drafts
    pstep.decode_rows = rows
    pstep.decode_start = start
    return DecodeBatch(
        req_ids=req_ids.tobytes(),
        start_pos=start.astype(np.int32).tobytes(),
        num_rows=rows.tobytes(),
        token_ids=tokens.tobytes(),
    )
