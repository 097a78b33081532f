"""Phase 4 of Scheduler.schedule, per partition: pages for the rows just budgeted, oldest
request first; when a pool runs dry the NEWEST running request is preempted by recompute
(pages freed, back to the front of the queue; it later re-prefills prompt + outputs and
continues with identical tokens).
"""

from __future__ import annotations

from dspark_loop.contract.protocol import BlockUpdate
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request


def map_pages(part: Partition, updates: list[BlockUpdate], preempted: list[int]) -> list[Request]:
    """Map the scheduled rows' pages (block updates into `updates`, preempted wire ids into
    `preempted`); returns the decode requests still running."""
    decodes = []
    # NOTE: iterating while preempting is safe: victims leave from the tail, behind req
    for req in part.running:
        n = req.sched_n
        if not n:
            continue
        end = req.plan_pos + n
        if end > req.map_limit:
            short = part.map(req, end, updates)
            if short is not None and req.plan_pending:
                # NOTE: planned ahead, req maps for its longest outcome while its ring
                # pages behind the window are still held (released from num_computed):
                # it sits this step out rather than preempting anyone (or itself,
                # again and again, when alone at its capacity peak); the next plan, from
                # known positions, maps what lockstep would
                part.sit_out(req)
                continue
            if short is not None:  # a pool is short: preempt from the tail
                if not _preempt_for(part, req, short, preempted):
                    break
                part.allocate(req, short, updates)
        if req.plan_pos >= req.prefill_target:
            decodes.append(req)
    return decodes


def _preempt_for(part: Partition, req: Request, counts: list[int], preempted: list[int]) -> bool:
    """Preempt from the tail until counts new pages fit; False when req itself went."""
    while not part.cache.can_allocate(counts):
        victim = part.running[-1]
        part.preempt(victim)
        preempted.append(victim.req_id)
        if victim is req:
            return False
    return True
