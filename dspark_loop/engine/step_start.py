"""Phase 1 of Scheduler.schedule: where each running request's next rows start (plan_pos)
and whether row 0's input is still to come (plan_pending): in lockstep, at num_computed;
planned ahead (async scheduling), where the unanswered step leaves the request.
"""

from __future__ import annotations

from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request

Start = tuple[int, bool, bool, bool]  # (plan_pos, plan_pending, plan_open, plan_drafts)
SITS_OUT: Start = (-1, False, False, False)


def plan_starts(
    partitions: list[Partition], inflight: int, spec_k: int, max_model_len: int, defers_masks: bool
) -> None:
    """Every running request's start for the step being planned (inflight: the unanswered
    step's id, -1 in lockstep), decided here and set by its Partition (plan)."""
    for part in partitions:
        if inflight < 0:
            part.plan([(req.num_computed, False, False, False) for req in part.running])
        else:
            part.plan([plan_position(r, inflight, spec_k, max_model_len, defers_masks) for r in part.running])


def plan_position(req: Request, inflight: int, spec_k: int, max_model_len: int, defers_masks: bool) -> Start:
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
    if req.inflight_step != inflight:
        return req.num_computed, False, False, False
    elif not req.inflight_samples:  # a prompt chunk that samples nothing: the next follows it
        return req.inflight_end, False, False, False
    elif (req.constraint is not None and (not defers_masks or (spec_k and req.inflight_drafted))) or len(
        req.output_ids
    ) + 1 >= req.length_at:
        # NOTE: the first: a constrained request's mask needs the unanswered step's tokens:
        # it runs when its mask may follow the plan (defers_masks), unless that step drafts
        # for it (its verify's drafts must be walked, and repaired, before the tile is
        # built; the loop plans in lockstep then: Scheduler.needs_lockstep).
        # The second: that step surely ends it (it commits at least one token);
        # one that only may (a verify that accepts enough) runs, and wastes its rows if it did
        return SITS_OUT
    elif req.inflight_rows <= 1:  # a prompt's last chunk or a 1-row decode: one token
        # NOTE: every step before the unanswered one is applied, so its decode row
        # started at num_computed (its planned start may have been a placeholder)
        end = req.num_computed + 1 if req.inflight_rows else req.inflight_end
        # NOTE: the ranks draft from an anchor at P iff P + K + 1 <= max_model_len (and
        # the step did not skip the request's drafter pass)
        return end, True, False, bool(spec_k) and req.inflight_drafted and end + k1 <= max_model_len
    else:
        # NOTE: that verify started at num_computed too; the longest outcome accepts
        # all its rows, and an anchor there still gets drafts
        end = req.num_computed + req.inflight_rows
        if end + k1 > max_model_len:
            return SITS_OUT
        return end, True, True, req.inflight_drafted
