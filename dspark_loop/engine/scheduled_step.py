"""What schedule() decided for one step: the wire plan plus what update() needs to read
the results back (which request each sampled token belongs to)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dspark_loop.contract.protocol import (
    StepPlan,
)
from dspark_loop.engine.request import Request, Status


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
    verify_lens: np.ndarray | None = None  # [V] drafts each verifies (rows - 1); None: all K
    draft_next: np.ndarray | None = None  # [R] bool: runs its drafter pass; None: all do
    # async scheduling, K=7: decode requests (indices into decode_reqs) whose start and
    # verify drafts the ranks filled (placeholders); reconcile() rebuilds them before reading
    filled: np.ndarray | None = None  # [F]
    num_placeholder_rows: int = 0  # decode rows whose input is a PLACEHOLDER (the tap's view)
    num_open_starts: int = 0  # K=7 windows whose start is a PLACEHOLDER
    live: list[bool] | None = None  # per decode request, at the read: still running (None: all)
    late_masked: list[Request] = field(default_factory=list)  # constrained, masks after the plan (late_masks)

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
    overlapped: bool = False  # planned while the step before it was unanswered (async scheduling)
    aborted_req_ids: list[int] = field(default_factory=list)  # since the previous plan
    # (req_ids [R], survival [R, K], request class [R]) the verify policy predicted for this
    # step's windows (calibration.request_class), or None
    verify_survival: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    masks_s: float = 0.0  # the loop's fill of the masks that followed the plan (late_masks)
    left_mark: int = 0  # Scheduler's count of requests that left running when this plan began
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


def reconcile(pstep: PartitionStep, draft_table: np.ndarray) -> None:
    """K=7, before reading a step planned while the one before it flew: the verify drafts
    and starts the ranks filled, rebuilt from the host's own state, which the earlier
    step's update has brought to exactly what the ranks used (the same acceptance, the
    same drafts). A request that ended meanwhile gets any row (its results are dropped)."""
    j, vd, leases = pstep.filled, pstep.verify_drafts, pstep.decode_leases  # [F], [V, K], [R]
    assert j is not None and leases is not None, "reconcile() of a step the ranks filled nothing in"
    reqs = pstep.decode_reqs
    every = len(j) == len(reqs)  # every request's (the steady state): no per-request index
    if every:
        pstep.decode_start[:] = [r.num_computed for r in reqs]
    else:
        pstep.decode_start[j] = [reqs[i].num_computed for i in j.tolist()]
    if every and vd is not None and len(vd) == len(reqs):  # ... and every one verifies
        _check_drafts(reqs)
        vd[:] = draft_table[leases]
    else:
        verify = pstep.decode_rows > 1  # [R]
        jv = j[verify[j]]  # [F'] the filled requests that verify
        if len(jv):
            _check_drafts([reqs[i] for i in jv.tolist()])
            assert vd is not None
            vidx = (np.cumsum(verify) - 1)[jv]  # [F'] rows of verify_drafts
            vd[vidx] = draft_table[leases[jv]]
    pstep.filled = None


def _check_drafts(verifying: list[Request]) -> None:
    """Every running request whose filled verify is rebuilt holds the drafts it verified."""
    bad = [r for r in verifying if not r.has_drafts and r.status == Status.RUNNING]
    if bad:
        raise RuntimeError(f"{bad[0]} verified drafts the host never received")
