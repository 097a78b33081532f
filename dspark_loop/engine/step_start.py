"""Phase 1 of Scheduler.schedule: where each running request's next rows start (plan_pos)
and whether row 0's input is still to come (plan_pending): in lockstep, at num_computed;
planned ahead (async scheduling), where the unanswered step leaves the request.

What the unanswered step left a request is read from that step's PartitionStep (its
decode rows and drafter skips), not kept per request: in the steady state (every running
request decoded in it, in running order) a partition's starts are one comprehension over
its requests, not a Python call per request.
"""

from __future__ import annotations

from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduled_step import PartitionStep, ScheduledStep

Start = tuple[int, bool, bool, bool]  # (plan_pos, plan_pending, plan_open, plan_drafts)
SITS_OUT: Start = (-1, False, False, False)
# what a request's rows in the unanswered step were: (end, samples, decode rows, drafted):
# the position after them, whether they sample a token (a decode, or a prompt's last
# chunk), how many decode rows (0: a prompt chunk; a verify: 1 + l), whether the ranks
# draft after them (no drafter skip)
Flight = tuple[int, bool, int, bool]


def plan_starts(
    partitions: list[Partition],
    flying: ScheduledStep | None,
    spec_k: int,
    max_model_len: int,
    defers_masks: bool,
    constrained: int,
) -> None:
    """Every running request's start for the step being planned (flying: the unanswered
    step, None in lockstep), decided here and set by its Partition (plan). constrained:
    how many live requests have an output grammar."""
    for part in partitions:
        running = part.running
        if flying is None:
            part.plan_at_computed()
            continue
        fly = flying.partitions[part.index]
        # NOTE: matched by wire id: a request admitted again since has a new one
        steady = not fly.prefills and not constrained and [r.req_id for r in running] == fly.decode_req_ids.tolist()
        if steady:
            starts = _steady_starts(running, fly, spec_k, max_model_len)
        else:
            flights = _flights(fly)
            starts = [plan_position(r, flights.get(r.req_id), spec_k, max_model_len, defers_masks) for r in running]
        part.plan(starts)


def _flights(fly: PartitionStep) -> dict[int, Flight]:
    """What the unanswered step holds of each of a partition's requests, by wire id (a
    request admitted since has a new one: nothing of it is in flight)."""
    out: dict[int, Flight] = {}
    for req, n, sample in fly.prefills:
        out[req.req_id] = (req.plan_pos + n, sample, 0, not sample or req.draft_next)
    dn = fly.draft_next  # [R] or None: every decode request drafts
    drafted = [True] * len(fly.decode_reqs) if dn is None else dn.tolist()
    for req, rows, d in zip(fly.decode_reqs, fly.decode_rows.tolist(), drafted):
        out[req.req_id] = (req.plan_pos + rows, True, rows, d)
    return out


def _steady_starts(running: list[Request], fly: PartitionStep, spec_k: int, max_model_len: int) -> list[Start]:
    """plan_position() for a partition whose running requests all decoded in the unanswered
    step, in running order (its decode_reqs), none constrained: one comprehension, no call
    per request (at 64 requests a partition this beats numpy's per-call cost)."""
    if not spec_k:  # K=0: one row each, never drafts
        return [
            (r.num_computed + 1, True, False, False) if len(r.output_ids) + 1 < r.length_at else SITS_OUT
            for r in running
        ]
    k1 = spec_k + 1
    drafted = [True] * len(running) if fly.draft_next is None else fly.draft_next.tolist()
    return [
        SITS_OUT
        if len(r.output_ids) + 1 >= r.length_at
        else ((e := r.num_computed + 1), True, False, bool(spec_k) and d and e + k1 <= max_model_len)
        if n <= 1
        else (e, True, True, d)
        if (e := r.num_computed + n) + k1 <= max_model_len
        else SITS_OUT
        for r, n, d in zip(running, fly.decode_rows.tolist(), drafted)
    ]


def plan_position(req: Request, flight: Flight | None, spec_k: int, max_model_len: int, defers_masks: bool) -> Start:
    """Async scheduling, while a step is unanswered (flight: what it holds of req, None:
    nothing): where req's next rows start (plan_pos) and whether row 0's input is that
    step's sample (plan_pending: a PLACEHOLDER the ranks resolve); plan_pos -1: the request
    sits out. K=7: after a verify the start is the ranks' (plan_open; plan_pos is the
    latest it can be, so pages are mapped for the longest outcome) and the drafts are
    (plan_drafts).
    NOTE: a request sits out one step when its next rows need what the unanswered step
    returns (a grammar mask over the new token), when that step surely ends it (its length
    limit), or at K=7 when its window could pass the position ceiling."""
    k1 = spec_k + 1
    # NOTE: plan_open and plan_drafts are read only when plan_pending is set
    if flight is None:
        return req.num_computed, False, False, False
    end, samples, rows, drafted = flight
    if not samples:  # a prompt chunk that samples nothing: the next follows it
        return end, False, False, False
    elif (req.constraint is not None and (not defers_masks or (spec_k and drafted))) or len(
        req.output_ids
    ) + 1 >= req.length_at:
        # NOTE: the first: a constrained request's mask needs the unanswered step's tokens:
        # it runs when its mask may follow the plan (defers_masks), unless that step drafts
        # for it (its verify's drafts must be walked, and repaired, before the tile is
        # built; the loop plans in lockstep then: Scheduler.needs_lockstep).
        # The second: that step surely ends it (it commits at least one token);
        # one that only may (a verify that accepts enough) runs, and wastes its rows if it did
        return SITS_OUT
    elif rows <= 1:  # a prompt's last chunk or a 1-row decode: one token
        # NOTE: every step before the unanswered one is applied, so its decode row
        # started at num_computed (its planned start may have been a placeholder)
        end = req.num_computed + 1 if rows else end
        # NOTE: the ranks draft from an anchor at P iff P + K + 1 <= max_model_len (and
        # the step did not skip the request's drafter pass)
        return end, True, False, bool(spec_k) and drafted and end + k1 <= max_model_len
    else:
        # NOTE: that verify started at num_computed too; the longest outcome accepts
        # all its rows, and an anchor there still gets drafts
        end = req.num_computed + rows
        if end + k1 > max_model_len:
            return SITS_OUT
        return end, True, True, drafted
