"""Phase 4 of Scheduler.schedule: a partition's rows as its wire PartitionPlan (prefill
chunks, the decode tile) and the PartitionStep that says what the results will mean.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dspark_loop.contract.placeholders import PLACEHOLDER
from dspark_loop.contract.protocol import DSPARK_K, BlockUpdate, DecodeBatch, PartitionPlan, PrefillChunk, TokenMask
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request
from dspark_loop.engine.sampling_wire import next_prompt_token
from dspark_loop.engine.scheduled_step import PartitionStep


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
    rows_l = [r.sched_n for r in decodes]
    rows = np.array(rows_l, np.int8)  # [R]
    start = np.fromiter([r.plan_pos for r in decodes], np.int64, n)  # [R]
    req_ids = np.fromiter([r.req_id for r in decodes], np.int32, n)  # [R]
    pending_l = [r.plan_pending for r in decodes]
    num_pending = sum(pending_l)
    every = num_pending == n  # planned ahead, the steady state: every row 0 is a placeholder
    leases = None if drafts is None else np.fromiter([r.lease for r in decodes], np.int64, n)  # [R]
    if every:  # every row is a placeholder: the ranks fill them, reconcile() the drafts
        tokens = np.full(sum(rows_l), PLACEHOLDER, np.int32)
        low = min(rows_l)
        if max(rows_l) > 1:
            assert drafts is not None, "verify rows need the draft table"
            lens = rows[rows > 1].astype(np.int64) - 1 if low <= DSPARK_K else None  # [V] 1..K; None: all K
            pstep.verify_drafts = np.empty((n if lens is None else len(lens), DSPARK_K), np.int32)  # [V, K]
            if lens is not None and lens.min() < DSPARK_K:
                pstep.verify_lens = lens
        pstep.num_placeholder_rows = len(tokens)
        if drafts is not None:  # K=7: the ranks fill the starts after a verify too
            opened = [r.plan_open for r in decodes]  # [R]
            num_open = sum(opened)
            if num_open == n:
                start[:] = PLACEHOLDER
            elif num_open:
                start[np.array(opened, bool)] = PLACEHOLDER
            pstep.num_open_starts = num_open
            pstep.filled = np.arange(n)
    else:
        # [R] row 0: the last token, or a placeholder for the sample of the unanswered step
        last = np.fromiter([PLACEHOLDER if p else r.output_ids[-1] for r, p in zip(decodes, pending_l)], np.int32, n)
        pending = np.array(pending_l, bool)  # [R]
        tokens = last if max(rows_l) == 1 else _verify_tile(pstep, rows, last, pending, drafts, leases)
        pstep.num_placeholder_rows = int(rows[pending].sum()) if num_pending else 0
        if drafts is not None and num_pending:  # K=7 with a step unanswered: the ranks fill these
            pj = np.flatnonzero(pending)  # [F]
            opened_f = np.fromiter([decodes[j].plan_open for j in pj.tolist()], bool, len(pj))  # [F]
            start[pj[opened_f]] = PLACEHOLDER
            pstep.num_open_starts = int(opened_f.sum())
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


def _verify_tile(pstep: PartitionStep, rows: np.ndarray, last: np.ndarray, pending: np.ndarray, drafts, leases):
    """The decode rows [sum(rows)] when some request verifies: row 0 `last`, rows 1..l its
    first l drafts from the draft table (placeholders where pending); sets the step's
    verify drafts (and lengths when the tile is ragged)."""
    assert drafts is not None and leases is not None, "verify rows need the draft table"
    k = DSPARK_K
    if rows.min() == k + 1:  # every request verifies all K drafts: [R, K+1] rows
        tile = np.empty((len(rows), k + 1), np.int32)
        tile[:, 0] = last
        tile[:, 1:] = drafts[leases]
        pstep.verify_drafts = tile[:, 1:]  # [R, K] (a view: reconcile() writes the filled rows)
        if pending.any():
            tile[pending, 1:] = PLACEHOLDER
        return tile.reshape(-1)  # [R * (K+1)]
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
    return tokens
