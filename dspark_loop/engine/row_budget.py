"""Phase 3 of Scheduler.schedule, per partition: ring pages behind the window go back, then
each running request gets its rows (sched_n) under the step's token budget -- decode rows
first (1, or 1 + l when verifying l drafts), then continuing prefill chunks, in admission
order.
"""

from __future__ import annotations

from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request


def budget_rows(
    part: Partition, budget: int, chunk_cap: int, spec_k: int, max_model_len: int, adaptive: bool
) -> tuple[int, list[Request]]:
    """Returns the budget left and the prefilling requests (their chunks, sched_n, may be 0).
    adaptive: the verify policy chose each decode request's window (Request.verify_len)."""
    verify_n = spec_k + 1
    verify_limit = max_model_len - verify_n  # a verify needs num_computed <= this
    running = part.running
    rows = [0] * len(running)  # sched_n per running request, set by the Partition (assign_rows)
    prefilling = []  # indices into running
    for i, req in enumerate(running):
        if req.num_computed >= req.release_pos:
            # NOTE: ring pages behind the window go back here, before any page is mapped
            # (the pools are as if update() had released them), not in update(): a K=7
            # request maps its next ring page 6 positions before its oldest one leaves
            # the window (Flash: 32-token pages, window 128), so a release in update()
            # mostly fell in the same step as the mapping; from here the two meet only
            # when one step accepts 7-8 tokens across both positions.
            part.release_ring(req)
        if req.plan_pos < 0:  # sits this step out (step_start.py)
            continue
        if req.plan_pos < req.prefill_target:
            prefilling.append(i)
        elif spec_k and (req.plan_drafts if req.plan_pending else req.has_drafts) and req.plan_pos <= verify_limit:
            n = 1 + req.verify_len if adaptive else verify_n  # 1 + l rows (l = 0: one row)
            if n <= budget:
                rows[i] = n
                budget -= n
        elif budget > 0:
            rows[i] = 1
            budget -= 1
    for i in prefilling:
        if budget > 0:
            req = running[i]
            rows[i] = min(req.prefill_target - req.plan_pos, chunk_cap, budget)
            budget -= rows[i]
    part.assign_rows(rows)
    return budget, [running[i] for i in prefilling]
