"""Allowed-token masks for constrained requests (tool-call grammars), one per sampled row.

A constrained request has exactly one sampled row per step (a finishing prefill chunk or
a K=0 decode row); its constraint is asked which tokens may follow the outputs so far, and
the answer travels packed in the plan. A constraint that fails finishes only its request:
token_masks() returns it with its message, and the Scheduler fails it.
"""

from __future__ import annotations

import logging

import numpy as np

from dspark_loop.contract.protocol import TokenMask, pack_mask
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduled_step import PartitionStep

log = logging.getLogger(__name__)


def token_masks(pstep: PartitionStep) -> tuple[list[TokenMask], list[tuple[Request, str]]]:
    """(masks for the plan, [(request, error message)] for constraints that failed)."""
    sampled = [r for r, _, sample in pstep.prefills if sample] + list(pstep.decode_reqs)
    masks: list[TokenMask] = []
    failed: list[tuple[Request, str]] = []
    for req in sampled:
        if req.constraint is None:
            continue
        try:
            allowed = req.constraint.allowed_token_mask(req.output_ids)  # [vocab] bool
            if not np.any(allowed):
                raise ValueError("the constraint allows no token")
        except Exception as e:  # noqa: BLE001 -- one request's constraint, not the engine
            log.exception("constraint of request %s failed", req.request_id)
            failed.append((req, f"the output constraint failed: {type(e).__name__}: {e}"))
            continue
        masks.append(TokenMask(req.req_id, pack_mask(allowed)))
    return masks, failed
