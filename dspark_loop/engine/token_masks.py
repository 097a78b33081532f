"""Allowed-token masks for constrained requests (grammars), one per masked logit row.

A constrained request's sampled rows are a finishing prefill chunk's last row, a K=0 decode
row, or a K=7 verify tile of 8 rows. Its constraint (duck-typed) is asked once per step:

    constraint.row_masks(output_ids, drafts) -> [packed mask] for rows 0..m, m <= len(drafts)

row i being what may follow the outputs and drafts[:i]. The list ends after the first draft
the grammar refuses: that row's masked pick cannot equal the draft, so acceptance stops
there by itself and the rows after it (left unmasked) are never used. The masks travel
packed in the plan as TokenMask(req_id, bits, row). A constraint that fails finishes only
its request: token_masks() returns it with its message, and the Scheduler fails it.
"""

from __future__ import annotations

import logging

import numpy as np

from dspark_loop.contract.protocol import TokenMask
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduled_step import PartitionStep

log = logging.getLogger(__name__)
NO_DRAFTS = np.zeros(0, np.int32)


def token_masks(
    pstep: PartitionStep, drafts: np.ndarray | None = None
) -> tuple[list[TokenMask], list[tuple[Request, str]]]:
    """(masks for the plan, [(request, error message)] for constraints that failed).
    drafts: the partition's draft table [leases, K] (K=7), read for verifying requests."""
    sampled = [r for r, _, sample in pstep.prefills if sample] + list(pstep.decode_reqs)
    masks, failed = [], []
    for req in sampled:
        if req.constraint is None:
            continue
        verifying = req.sched_n > 1 and req.num_computed >= req.prefill_target and drafts is not None
        row_drafts = drafts[req.lease] if verifying else NO_DRAFTS  # [K] or [0]
        try:
            rows = req.constraint.row_masks(req.output_ids, row_drafts.tolist())
            if not rows or not any(rows[0]):
                raise ValueError("the constraint allows no token")
        except Exception as e:  # noqa: BLE001 -- one request's constraint, not the engine
            log.exception("constraint of request %s failed", req.request_id)
            failed.append((req, f"the output constraint failed: {type(e).__name__}: {e}"))
            continue
        masks += [TokenMask(req.req_id, bits, i) for i, bits in enumerate(rows)]
    return masks, failed
