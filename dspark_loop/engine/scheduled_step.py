"""What schedule() decided for one step: the wire plan plus what update() needs to read
the results back (which request each sampled token belongs to)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.engine.request import Request
from dspark_loop.protocol import DecodeBatch, StepPlan, i8, i32


@dataclass
class PartitionStep:
    # (request, num_tokens, sample) per prefill chunk, in plan order
    prefills: list[tuple[Request, int, bool]] = field(default_factory=list)
    decode_reqs: list[Request] = field(default_factory=list)
    decode_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # [R]

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
    rows = np.fromiter((r.sched_n for r in decodes), np.int8, len(decodes))  # [R]
    last = np.fromiter((r.output_ids[-1] for r in decodes), np.int32, len(decodes))  # [R]
    if rows.max() == 1:
        tokens = last  # [R]
    else:
        tokens = np.empty(int(rows.sum()), np.int32)  # [sum(rows)]
        starts = np.concatenate([[0], np.cumsum(rows[:-1], dtype=np.int64)])
        tokens[starts] = last
        for r, s, k in zip(decodes, starts, rows):
            if k > 1:
                tokens[s + 1 : s + k] = r.draft_ids
    pstep.decode_rows = rows
    return DecodeBatch(
        req_ids=i32([r.req_id for r in decodes]),
        start_pos=i32([r.num_computed for r in decodes]),
        num_rows=i8(rows),
        token_ids=tokens.tobytes(),
    )
