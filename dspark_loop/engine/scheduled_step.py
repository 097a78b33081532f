"""What schedule() decided for one step: the wire plan plus what update() needs to read
the results back (which request each sampled token belongs to)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dspark_loop.contract.placeholders import PLACEHOLDER
from dspark_loop.contract.protocol import (
    DSPARK_K,
    BlockUpdate,
    DecodeBatch,
    PartitionPlan,
    PrefillChunk,
    StepPlan,
    TokenMask,
)
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request, Status
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
    # (req_ids [R], survival [R, K]) the verify policy predicted for this step's windows, or None
    verify_survival: tuple[np.ndarray, np.ndarray] | None = None
    masks_s: float = 0.0  # the loop's fill of the masks that followed the plan (late_masks)
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


def decode_batch(
    decodes: list[Request], pstep: PartitionStep, drafts: np.ndarray | None = None, masked: bool = False
) -> DecodeBatch:
    """The wire DecodeBatch: row 0 = last token, rows 1..l = the first l drafts when
    verifying (sched_n = 1 + l; a verify policy may make the tile ragged). drafts: the
    partition's draft table [L, K] (K=7), read at each verifying request's lease. masked:
    a verify policy skips some drafter passes (Request.draft_next): send the mask.
    A request planned after an unanswered step (plan_pending) gets placeholders for what
    that step decides: row 0, and at K=7 its drafts and, after a verify, its start."""
    n = len(decodes)
    rows = np.fromiter([r.sched_n for r in decodes], np.int8, n)  # [R]
    start = np.fromiter([r.plan_pos for r in decodes], np.int64, n)  # [R]
    req_ids = np.fromiter([r.req_id for r in decodes], np.int32, n)  # [R]
    # [R] row 0: the last token, or a placeholder for the sample of the unanswered step
    last = np.fromiter([PLACEHOLDER if r.plan_pending else r.output_ids[-1] for r in decodes], np.int32, n)
    leases = None if drafts is None else np.fromiter([r.lease for r in decodes], np.int64, n)  # [R]
    pending = last == PLACEHOLDER  # [R]
    k = DSPARK_K
    if rows.max() == 1:
        tokens = last
    elif rows.min() == k + 1:  # every request verifies all K drafts: [R, K+1] rows
        assert drafts is not None and leases is not None, "verify rows need the draft table"
        tile = np.empty((n, k + 1), np.int32)
        tile[:, 0] = last
        tile[:, 1:] = drafts[leases]
        pstep.verify_drafts = tile[:, 1:]  # [R, K] (a view: reconcile() writes the filled rows)
        if pending.any():
            tile[pending, 1:] = PLACEHOLDER
        tokens = tile.reshape(-1)  # [R * (K+1)]
    else:
        assert drafts is not None and leases is not None, "verify rows need the draft table"
        verify = rows > 1  # [R]
        rows64 = rows.astype(np.int64)
        first = np.cumsum(rows64) - rows64  # [R] each request's first row
        tokens = np.empty(int(rows64.sum()), np.int32)  # [sum(rows)]
        tokens[first] = last
        vd = drafts[leases[verify]]  # [V, K]
        lens = rows64[verify] - 1  # [V] 1..K
        window = first[verify, None] + np.arange(1, k + 1)  # [V, K]
        sent = np.arange(k) < lens[:, None]  # [V, K] the drafts each verify sends
        if lens.min() == k:
            tokens[window] = vd
        else:  # ragged: each verify sends its first l drafts
            tokens[window[sent]] = vd[sent]
            pstep.verify_lens = lens
        if pending.any():
            tokens[window[sent & pending[verify, None]]] = PLACEHOLDER
        pstep.verify_drafts = vd
    pstep.num_placeholder_rows = int(rows[pending].sum())
    if drafts is not None and pending.any():  # K=7 with a step unanswered: the ranks fill these
        pj = np.flatnonzero(pending)  # [F]
        opened = np.fromiter([decodes[j].plan_open for j in pj.tolist()], bool, len(pj))  # [F]
        start[pj[opened]] = PLACEHOLDER
        pstep.num_open_starts = int(opened.sum())
        pstep.filled = pj
    pstep.decode_rows = rows
    pstep.decode_start = start
    pstep.decode_req_ids = req_ids
    pstep.decode_leases = leases
    mask = b""
    if masked:
        dn = np.array([r.draft_next for r in decodes], bool)  # [R]
        if not dn.all():
            pstep.draft_next = dn
            mask = dn.astype(np.uint8).tobytes()
    return DecodeBatch(
        req_ids=req_ids.tobytes(),
        start_pos=start.astype(np.int32).tobytes(),
        num_rows=rows.tobytes(),
        token_ids=tokens.tobytes(),
        draft_mask=mask,
    )


def reconcile(pstep: PartitionStep, draft_table: np.ndarray) -> None:
    """K=7, before reading a step planned while the one before it flew: the verify drafts
    and starts the ranks filled, rebuilt from the host's own state, which the earlier
    step's update has brought to exactly what the ranks used (the same acceptance, the
    same drafts). A request that ended meanwhile gets any row (its results are dropped)."""
    j, vd, leases = pstep.filled, pstep.verify_drafts, pstep.decode_leases  # [F], [V, K], [R]
    assert j is not None and leases is not None, "reconcile() of a step the ranks filled nothing in"
    reqs = [pstep.decode_reqs[i] for i in j.tolist()]
    pstep.decode_start[j] = [r.num_computed for r in reqs]
    verify = pstep.decode_rows > 1  # [R]
    jv = j[verify[j]]  # [F'] the filled requests that verify
    if len(jv):
        for req, v in zip(reqs, verify[j].tolist()):
            if v and not req.has_drafts and req.status == Status.RUNNING:
                raise RuntimeError(f"{req} verified drafts the host never received")
        assert vd is not None
        vidx = (np.cumsum(verify) - 1)[jv]  # [F'] rows of verify_drafts
        vd[vidx] = draft_table[leases[jv]]
    pstep.filled = None


def plan_positions(
    running: list[Request], inflight: int, spec_k: int, max_model_len: int, defers_masks: bool = False
) -> None:
    """Async scheduling, while step `inflight` is unanswered: where each running request's
    next rows start (plan_pos) and whether row 0's input is that step's sample
    (plan_pending: a PLACEHOLDER the ranks resolve); plan_pos -1: the request sits out.
    K=7: after a verify the start is the ranks' (plan_open; plan_pos is the latest it can
    be, so pages are mapped for the longest outcome) and the drafts are (plan_drafts).
    NOTE: a request sits out one step when its next rows need what the unanswered step
    returns (a grammar mask over the new token), when that step surely ends it (its length
    limit), or at K=7 when its window could pass the position ceiling."""
    k1 = spec_k + 1
    # NOTE: plan_open and plan_drafts are read only when plan_pending is set
    for req in running:
        if req.inflight_step != inflight:
            req.plan_pos, req.plan_pending = req.num_computed, False
        elif not req.inflight_samples:  # a prompt chunk that samples nothing: the next follows it
            req.plan_pos, req.plan_pending = req.inflight_end, False
        elif (req.constraint is not None and (not defers_masks or (spec_k and req.inflight_drafted))) or len(
            req.output_ids
        ) + 1 >= req.length_at:
            # NOTE: the first: a constrained request's mask needs the unanswered step's tokens:
            # it runs when its mask may follow the plan (defers_masks), unless that step drafts
            # for it (its verify's drafts must be walked, and repaired, before the tile is
            # built; the loop plans in lockstep then: Scheduler.needs_lockstep).
            # The second: that step surely ends it (it commits at least one token);
            # one that only may (a verify that accepts enough) runs, and wastes its rows if it did
            req.plan_pos, req.plan_pending = -1, False
        elif req.inflight_rows <= 1:  # a prompt's last chunk or a 1-row decode: one token
            # NOTE: every step before the unanswered one is applied, so its decode row
            # started at num_computed (its planned start may have been a placeholder)
            end = req.num_computed + 1 if req.inflight_rows else req.inflight_end
            req.plan_pos, req.plan_pending, req.plan_open = end, True, False
            # NOTE: the ranks draft from an anchor at P iff P + K + 1 <= max_model_len (and
            # the step did not skip the request's drafter pass)
            req.plan_drafts = bool(spec_k) and req.inflight_drafted and end + k1 <= max_model_len
        else:
            # NOTE: that verify started at num_computed too; the longest outcome accepts
            # all its rows, and an anchor there still gets drafts
            end = req.num_computed + req.inflight_rows
            if end + k1 > max_model_len:
                req.plan_pos, req.plan_pending = -1, False
            else:
                req.plan_pos, req.plan_pending, req.plan_open = end, True, True
                req.plan_drafts = req.inflight_drafted


def note_inflight(step: ScheduledStep) -> None:
    """Remember, per request, what the step just planned leaves unanswered."""
    sid = step.step_id
    for pstep in step.partitions:
        for req, n, sample in pstep.prefills:
            req.inflight_step, req.inflight_end, req.inflight_samples = sid, req.plan_pos + n, sample
            req.inflight_rows, req.inflight_drafted = 0, not sample or req.draft_next
        dn = pstep.draft_next  # [R] or None: every decode request drafts
        for j, req in enumerate(pstep.decode_reqs):
            req.inflight_step, req.inflight_end, req.inflight_samples = sid, req.plan_pos + req.sched_n, True
            req.inflight_rows, req.inflight_drafted = req.sched_n, dn is None or bool(dn[j])


def partition_step(
    part: Partition,
    prefills: list[tuple[Request, int]],
    decodes: list[Request],
    updates: list[BlockUpdate],
    masked: bool = False,
    mask: Callable[[Partition, PartitionStep], list[TokenMask]] | None = None,
) -> tuple[PartitionStep, PartitionPlan]:
    """Phase 4 of Scheduler.schedule: a partition's PartitionStep (what the results will
    mean) and its wire plan; the freed ids and new leases since the last sent plan go in.
    Rows start at each request's plan_pos (num_computed, or past an unanswered step)."""
    pstep = PartitionStep()
    for req, n in prefills:
        pstep.prefills.append((req, n, req.plan_pos + n == req.prefill_target))
    pplan = PartitionPlan(block_updates=updates)
    pplan.prefills = [
        PrefillChunk(
            r.req_id,
            r.plan_pos,
            r.token_bytes(r.plan_pos, r.plan_pos + n),
            s,
            next_prompt_token(r, r.plan_pos + n, s),
            not s or r.draft_next,
        )
        for r, n, s in pstep.prefills
    ]
    if decodes:
        pstep.decode_reqs = decodes
    if mask is not None:  # NOTE: before the tile: a verify's forced tokens replace its drafts
        pplan.token_masks = mask(part, pstep)
    if decodes:
        pplan.decode = decode_batch(decodes, pstep, part.drafts, masked)
    if pstep.is_empty:
        pplan.freed_req_ids = []  # keep them for a plan that is actually sent
    else:
        pplan.freed_req_ids, part.freed_req_ids = part.freed_req_ids, []
    part.take_lease_fields(pplan)  # admissions only happen in a non-empty step
    return pstep, pplan
