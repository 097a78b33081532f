"""Recovery: what the engine does when its rank mesh dies, beside mesh/supervisor.py.

Without recovery a dead mesh (EngineDead) ends every request with an error and the engine
stays dead. With it (EngineLoop.on_mesh_dead, set by the supervisor) the loop calls
carry_over(): the running requests end with an error, the waiting ones (no pages, nothing
computed that is kept) go back to the inbox; the supervisor restarts the ranks and calls
EngineLoop.resume(mesh, scheduler) with empty pools, or give_up(reason). While idle, the loop
watches the mesh (wait_for_work), so /health says 503 before the next step would fail.
"""

from __future__ import annotations

import asyncio

from dspark_loop.contract.errors import EngineDead
from dspark_loop.engine.interfaces import MeshClient
from dspark_loop.engine.outputs import RequestOutput, error_output
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduler import Scheduler

IDLE_CHECK_S = 0.5  # an idle loop with recovery looks this often whether its mesh died


async def wait_for_work(wakeup: asyncio.Event, mesh: MeshClient, watch: bool) -> None:
    """Wait for work; watch: also raise EngineDead for a mesh that died meanwhile."""
    if not watch:
        await wakeup.wait()
        return
    while not wakeup.is_set():
        if mesh.dead:
            raise EngineDead(mesh.dead)
        try:
            await asyncio.wait_for(wakeup.wait(), IDLE_CHECK_S)
        except asyncio.TimeoutError:
            pass


def carry_over(sched: Scheduler, reason: str) -> tuple[list[RequestOutput], list[Request], int]:
    """The mesh died: (the outputs to deliver now: those not yet delivered and an error for
    every running request, the waiting requests in arrival order, how many failed)."""
    running, waiting, early = sched.carry_over()
    errors = [
        error_output(r.request_id, f"the ranks failed: {reason}", r.prompt_len, len(r.output_ids)) for r in running
    ]
    return early + errors, waiting, len(running)
