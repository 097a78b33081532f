"""MeshSupervisor: the rank mesh's lifetime, recovery included.

    start()          spawn the ranks, run `prepare` on them (the start-up verify profile:
                     dummy steps before any request), then the scheduler and the engine loop
    a dead mesh      (a rank exited, was stopped, failed a step or missed the step timeout)
                     the engine fails the running requests and keeps the waiting ones,
                     then calls _restart(): kill what is left of the old ranks, spend one
                     restart of the budget (--max-rank-restarts per RESTART_WINDOW_S),
                     spawn fresh ranks (weights reloaded), build a fresh scheduler (empty
                     pools, leases and prefix cache) and resume the loop; /health says
                     503 "restarting" meanwhile. Past the budget, or if the new ranks fail
                     to start, the engine gives up: dead, 503, the reason in the log.
                     Other nodes (--nnodes): the dying mesh tells their agents
                     Shutdown(rejoin=True) when the budget allows a restart, so they stop
                     their ranks and join the new mesh (same --dist-init-addr ports); a lost
                     node must come back (its agent restarted) within --dist-timeout, else
                     the restart fails and the engine gives up (agents then exit 1).
    close()          the restart in flight, the engine loop, the ranks

Every restart is a log line, dspark:mesh_restarts_total and a trace (a MeshRestart to
every observer; the debug tap publishes it). The factories keep this file free of how a
mesh or a scheduler is configured (launch.py knows).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from dspark_loop.contract.errors import MeshStartError
from dspark_loop.contract.protocol import MeshRestart
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.scheduler import Scheduler
from dspark_loop.mesh.restart_budget import RestartBudget

log = logging.getLogger("dspark_loop")


class MeshSupervisor:
    def __init__(
        self,
        new_mesh: Callable[[], object],
        new_scheduler: Callable[[list[int]], Scheduler],
        tokenizer,
        observers: list[EngineObserver],
        budget: RestartBudget,
        async_scheduling: bool = True,
        stream_interval: int = 1,
        prepare: Callable[[object], Awaitable[None]] | None = None,
    ):
        self.prepare = prepare  # the first mesh, started, before the engine: prepare(mesh)
        self.async_scheduling = async_scheduling
        self.stream_interval = stream_interval
        self.new_mesh = new_mesh  # -> an unstarted Mesh
        self.new_scheduler = new_scheduler  # pages per family -> a Scheduler
        self.tokenizer = tokenizer
        self.observers = observers
        self.budget = budget
        self.mesh = None
        self.engine: EngineLoop | None = None
        self.num_restarts = 0
        self._restart: asyncio.Task | None = None
        self._starting: asyncio.Task | None = None

    def _fresh_mesh(self):
        mesh = self.new_mesh()
        # other nodes' agents stay for the next mesh only if a restart will follow
        mesh.rejoin_on_death = lambda: self.budget.available(time.monotonic())
        return mesh

    async def start(self) -> EngineLoop:
        self._starting = asyncio.current_task()  # close() cancels a start-up in flight
        self.mesh = self._fresh_mesh()
        await self.mesh.start()
        if self.prepare is not None:
            await self.prepare(self.mesh)
        self._starting = None
        for ob in self.observers:
            ob.set_num_blocks_total(self.mesh.num_blocks)
        self.engine = EngineLoop(
            self.new_scheduler(self.mesh.num_blocks),
            self.mesh,
            self.tokenizer,
            observers=self.observers,
            async_scheduling=self.async_scheduling,
            stream_interval=self.stream_interval,
        )
        if self.budget.max_restarts > 0:
            self.engine.on_mesh_dead = self._on_mesh_dead
        self.engine.start()
        return self.engine

    async def _on_mesh_dead(self, reason: str, num_failed: int) -> None:
        self._restart = asyncio.current_task()
        t0 = time.monotonic()
        await self.mesh.close(grace_s=0.0)
        if not self.budget.take(t0):
            why = f"{reason}; not restarting: {self.budget.why()}"
            log.error("engine dead: %s", why)
            self.engine.give_up(why)
            return
        log.warning(
            "restarting the rank mesh (restart %d of at most %d in %g s) after: %s",
            self.budget.used,
            self.budget.max_restarts,
            self.budget.window_s,
            reason,
        )
        try:
            self.mesh = self._fresh_mesh()
            await self.mesh.start()
        except MeshStartError as e:
            why = f"{reason}; the restarted ranks failed to start: {e}"
            log.error("engine dead: %s", why)
            self.engine.give_up(why)
            return
        num_kept = self.engine.num_waiting
        self.engine.resume(self.mesh, self.new_scheduler(self.mesh.num_blocks))
        self.num_restarts += 1
        event = MeshRestart(reason, time.monotonic() - t0, self.num_restarts, num_failed, num_kept)
        log.warning(
            "rank mesh restarted in %.2f s: serving again (%d request(s) failed at the death, %d kept)",
            event.restart_s,
            num_failed,
            num_kept,
        )
        for ob in self.observers:
            try:
                ob.on_mesh_restart(event)
            except Exception:  # noqa: BLE001 -- an observer must never stop a recovery
                log.exception("observer %r failed", ob)

    async def close(self) -> None:
        """Stop a start-up or restart in flight, the engine loop, then the ranks."""
        for task in (self._starting, self._restart):
            if task is not None and not task.done() and task is not asyncio.current_task():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 -- closing anyway
                    pass
        if self.engine is not None:
            await self.engine.stop()
        if self.mesh is not None:
            await self.mesh.close()
