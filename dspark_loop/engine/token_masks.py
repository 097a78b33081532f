"""Allowed-token masks for constrained requests (grammars), one per masked logit row.

A constrained request's sampled rows are a finishing prefill chunk's last row, a K=0 decode
row, or a K=7 verify tile of 8 rows. Its constraint (duck-typed) is asked once per step:

    constraint.row_masks(output_ids, drafts) -> [packed mask] for rows 0..m, m <= len(drafts)
    (it may change `drafts`, a list, in place: a token the grammar forces replaces its draft)

row i being what may follow the outputs and drafts[:i]. The list ends after the first draft
the grammar refuses: that row's masked pick cannot equal the draft, so acceptance stops
there by itself and the rows after it (left unmasked) are never used. The masks travel
packed as TokenMask(req_id, bits, row): a verify's in the plan (its forced tokens change the
tile), a one-row request's, with defer, in the StepMasks that follows the plan (fill_masks,
once the plan is sent: the ranks run the forward meanwhile). A constraint that fails
finishes only its request: it is returned with its message, and the Scheduler fails it.
"""

from __future__ import annotations

import logging

import numpy as np

from dspark_loop.contract.protocol import TokenMask
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduled_step import PartitionStep

log = logging.getLogger(__name__)


def token_masks(
    pstep: PartitionStep,
    drafts: np.ndarray | None = None,
    defer: bool = False,
    walked: dict[int, list[bytes]] | None = None,
) -> tuple[list[TokenMask], list[tuple[Request, str]], list[Request]]:
    """(masks for the plan, [(request, error message)] for constraints that failed, the
    requests whose masks were deferred).
    drafts: the partition's draft table [leases, K] (K=7), read for verifying requests and
    written back with the forced tokens: call it before the plan's tile is built.
    defer: leave out the requests whose rows hold no drafts (one row, masked by what
    follows its outputs alone): fill_masks() answers for them once the plan is sent, while
    the ranks run the forward (StepPlan.masks_follow). A verify's masks stay in the plan:
    its forced tokens change the tile.
    walked: req_id -> the masks of rows 0..m of a verifying request's window, walked (and
    its drafts repaired) before the verify policy chose the window's length
    (Scheduler._walk_windows): its rows' masks are the first sched_n of them."""
    sampled = [r for r, _, sample in pstep.prefills if sample] + list(pstep.decode_reqs)
    bound, windows, deferred = [], [], []
    masks: list[TokenMask] = []
    for req in sampled:
        if req.constraint is None:
            continue
        verifying = req.sched_n > 1 and req.num_computed >= req.prefill_target
        rows = walked.get(req.req_id) if walked and verifying else None
        if rows is not None:
            masks += [TokenMask(req.req_id, bits, i) for i, bits in enumerate(rows[: req.sched_n])]
            continue
        # the request's window: its first sched_n - 1 drafts (adaptive verification may verify fewer than K)
        window = drafts[req.lease, : req.sched_n - 1].tolist() if verifying and drafts is not None else []
        if defer and not window:
            deferred.append(req)
            continue
        bound.append(req)
        windows.append(window)  # [l] or []
    if not bound:
        return masks, [], deferred
    more, failed = fill_masks(bound, windows)
    masks += more
    for req, d in zip(bound, windows):
        if d and drafts is not None:  # NOTE: forced tokens go back into the draft table, which the tile reads
            drafts[req.lease, : len(d)] = d
    return masks, failed, deferred


def fill_masks(
    bound: list[Request], windows: list[list[int]] | None = None
) -> tuple[list[TokenMask], list[tuple[Request, str]]]:
    """The masks of constrained requests' rows (row i follows the outputs and window[:i];
    no windows: one row each), and the constraints that failed. Forced tokens replace the
    windows' drafts in place."""
    masks: list[TokenMask] = []
    failed: list[tuple[Request, str]] = []
    for req, rows in zip(bound, walk(bound, windows, failed)):
        if rows is not None:
            masks += [TokenMask(req.req_id, bits, i) for i, bits in enumerate(rows)]
    return masks, failed


def walk(
    bound: list[Request], windows: list[list[int]] | None, failed: list[tuple[Request, str]]
) -> list[list[bytes] | None]:
    """Each constrained request's packed row masks (row i follows the outputs and
    window[:i]; no windows: one row each), None where its constraint failed (appended to
    `failed` with its message). Forced tokens replace the windows' drafts in place."""
    windows = [[] for _ in bound] if windows is None else windows
    out: list[list[bytes] | None] = []
    for req, rows in zip(bound, _ask(bound, windows)):
        if not isinstance(rows, Exception) and (not rows or not any(rows[0])):
            rows = ValueError("the constraint allows no token")
        if isinstance(rows, Exception):
            log.error("constraint of request %s failed: %s", req.request_id, rows)
            failed.append((req, f"the output constraint failed: {type(rows).__name__}: {rows}"))
            out.append(None)
            continue
        out.append(rows)
    return out


def _ask(bound: list[Request], row_drafts: list[list[int]]) -> list:
    """Each request's masks (or the exception it raised). NOTE: constraints of one kind that
    offer a batch_row_masks are asked together (one batched fill per row index, off the GIL
    in xgrammar's threads); others one by one."""
    answers: list = [None] * len(bound)
    kinds: dict[type, list[int]] = {}
    for i, req in enumerate(bound):
        kinds.setdefault(type(req.constraint), []).append(i)
    for kind, idx in kinds.items():
        batch = getattr(kind, "batch_row_masks", None)
        if batch is not None and len(idx) > 1:
            got = batch(
                [bound[i].constraint for i in idx], [bound[i].output_ids for i in idx], [row_drafts[i] for i in idx]
            )
            for i, a in zip(idx, got):
                answers[i] = a
            continue
        for i in idx:
            c = bound[i].constraint
            assert c is not None  # bound: the constrained requests
            try:
                answers[i] = c.row_masks(bound[i].output_ids, row_drafts[i])
            except Exception as e:  # noqa: BLE001 -- one request's constraint, not the engine
                answers[i] = e
    return answers
