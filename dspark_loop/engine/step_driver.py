"""The step driver: the engine loop's busy loop, steps 1-6 of engine/loop.py's diagram.

One driver at a pipeline depth of 1 (lockstep: plan, send, gather, apply) or 2 (async
scheduling: plan and send step N+1, then gather, apply and deliver step N). It owns what only
the busy loop needs (when the last results came in, the observers' hand-off); the requests,
their channels and the engine's lifecycle stay with the EngineLoop, which runs drive() inside
its one top-level try.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from dspark_loop.engine.device_time import DeviceTime
from dspark_loop.engine.interfaces import MeshClient
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import RequestOutput
from dspark_loop.engine.recovery import wait_for_work
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.engine.scheduler import Scheduler
from dspark_loop.engine.step_pipe import StepPipe
from dspark_loop.engine.step_trace import StepTimes, request_stats, step_trace

log = logging.getLogger(__name__)


class DriverHost(Protocol):
    """What the driver uses of the EngineLoop that owns it (engine/loop.py)."""

    scheduler: Scheduler
    mesh: MeshClient
    observers: list[EngineObserver]
    device_time: DeviceTime
    num_steps: int
    on_mesh_dead: Callable[[str, int], Coroutine[Any, Any, None]] | None
    wakeup: asyncio.Event

    @property
    def stopping(self) -> bool: ...

    @property
    def overlaps(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    def drain_inbox(self) -> None: ...

    def deliver(self, outputs: list[RequestOutput]) -> None: ...


class StepDriver:
    def __init__(self, loop: DriverHost):
        self.loop = loop
        self._last_result_at = 0.0  # perf_counter() when the last gathered step's results came in
        self._last_result_cpu: float | None = None  # the loop thread's CPU then (None after idling)
        self._mesh_yielded = False

    async def drive(self, pipe: StepPipe) -> None:
        """The driver, at a pipeline depth of 1 (lockstep: plan, send, gather, apply) or 2
        (async scheduling: plan and send step N+1, then gather, apply and deliver step N; the
        ranks start N+1 as soon as they finish N, while the host applies N)."""
        loop = self.loop
        sched = loop.scheduler
        ahead = loop.overlaps
        sent: tuple[ScheduledStep, StepTimes] | None = None  # sent, not yet gathered (depth 2)
        while not loop.stopping:
            loop.drain_inbox()
            if sent is None and not sched.has_work:
                sched.check_integrity()
                loop.wakeup.clear()
                await self._idle_wait()
                continue
            if sent is not None and sched.needs_lockstep(sent[0].step_id):
                # NOTE: a constrained request drafts in the step in flight: its next verify's
                # drafts must be walked by its grammar (and repaired) before the tile is built.
                # Planned ahead it would sit out every other step (half its speed when
                # unconstrained ones keep the pipeline full); lockstep until it stops drafting.
                # One-row constrained requests run planned ahead: their masks follow the plan.
                await self._complete(pipe, *sent)
                sent = None
                continue
            times = StepTimes.begin()
            step = sched.schedule(ahead=ahead, defer_masks=True)  # planned ahead: from where `sent` leaves its requests
            times.planned()
            if not step.is_empty and not ahead:
                await self._complete(pipe, step, times)  # lockstep: sent, gathered and applied
                continue
            if not step.is_empty:
                await pipe.send(step.plan)
            completed = sent is not None
            if sent is not None:
                await self._complete(pipe, *sent)
                sent = None
            if step.plan.masks_follow:  # NOTE: after the step before it is applied: masks follow the outputs
                await self._send_masks(pipe, step)
            if not step.is_empty:
                sent = (step, times)
                continue
            # an empty step: nothing runs, but errors and aborts reach the consumers and observers
            times.gather_from()
            times.waited()
            outputs = sched.update(step, [])
            times.updated()
            loop.deliver(outputs)
            times.delivered()
            self._observe(step, [], times)
            if completed:
                continue  # the requests that sat this step out can run now
            if not outputs:
                # nothing could run (e.g. every queue waits on pages): do not spin
                loop.wakeup.clear()
                await loop.wakeup.wait()
            else:
                await asyncio.sleep(0)  # let consumers and new requests in

    async def _complete(self, pipe: StepPipe, step: ScheduledStep, times: StepTimes) -> None:
        """Gather, update, deliver and observe a sent step."""
        loop = self.loop
        if loop.overlaps:
            times.gather_from()
            results = await pipe.gather(step.step_id)
        else:
            results = await self._step_mesh(step, pipe)
        times.waited()
        outputs = loop.scheduler.update(step, results)
        times.updated()
        loop.deliver(outputs)
        times.delivered()
        loop.num_steps += 1
        if results and loop.scheduler.observes_steps:
            self._observe_cost(step, results, times)
        self._last_result_at = times.result_at
        self._last_result_cpu = times.cpu_result
        self._observe(step, results, times)

    def _observe_cost(self, step: ScheduledStep, results, times: StepTimes) -> None:
        """The verify policy learns the step's cost."""
        sched = self.loop.scheduler
        if not self.loop.overlaps:
            # NOTE: the host's share is its own thread's CPU time (schedule, update,
            # deliver): like the ranks' work_s, immune to other processes on the cores
            sched.observe_step(step, results, times.span_s, times.host_cpu_s)
            return
        # NOTE: the ranks' own work times are the step's cost; beside them this thread's CPU
        # from the previous step's results to this one's, everything it did per step (the
        # plan, the update, the streams' writes, new requests): the slower stage sets the
        # pace (feedback.py). Without work times, the wall time from when the ranks could
        # start it (its send, or the previous result, whichever came later) to its result: a
        # mesh that computes inside send() (in-process) makes that wall time another step's.
        wall_s = times.result_at - max(times.plan_end, self._last_result_at)
        host_s = None if self._last_result_cpu is None else times.cpu_result - self._last_result_cpu
        sched.observe_step(step, results, wall_s, host_s, overlapped=True)

    async def _step_mesh(self, step: ScheduledStep, pipe: StepPipe):
        """Lockstep: send the plan (and its late masks) and gather its results.
        NOTE: the loop does not yield between delivering step N and sending step N+1: the
        consumers of step N's outputs (SSE writes) run while the ranks compute N+1, when the
        mesh awaits their results. A mesh that answers without ever yielding (the test
        meshes) gets one yield afterwards, so consumers always get their turn."""
        self._mesh_yielded = False
        asyncio.get_running_loop().call_soon(self._note_mesh_yield)
        if step.plan.masks_follow:
            await pipe.send(step.plan)
            await self._send_masks(pipe, step)
            results = await pipe.gather(step.step_id)
        else:
            results = await pipe.step(step.plan)
        if not self._mesh_yielded:
            await asyncio.sleep(0)
        return results

    def _note_mesh_yield(self) -> None:
        self._mesh_yielded = True

    async def _send_masks(self, pipe: StepPipe, step: ScheduledStep) -> None:
        """The grammar masks the step's plan left out, filled now (the ranks run its forward
        meanwhile); the fill's time goes to the step's trace (masks_s)."""
        t0 = time.perf_counter()
        masks = self.loop.scheduler.late_masks(step)
        step.masks_s = time.perf_counter() - t0
        await pipe.send_masks(masks)

    async def _idle_wait(self) -> None:
        """Wait for work; with recovery on, also notice a mesh that died while idle."""
        loop = self.loop
        loop.device_time.pause()
        self._last_result_cpu = None
        await wait_for_work(loop.wakeup, loop.mesh, loop.on_mesh_dead is not None)

    def _observe(self, step: ScheduledStep, results, times: StepTimes) -> None:
        loop = self.loop
        if not loop.observers:
            return
        trace = step_trace(loop.scheduler, step, results, loop.num_waiting, times)
        trace.device_busy_s, trace.host_blocked_s = loop.device_time.take(step.step_id)
        stats = [request_stats(r) for r in step.finished]
        # NOTE: the trace is the state after this step; the observers (metrics, the tap's
        # encode + send: ~0.1-0.25 ms at 256 requests) run at the loop's next yield, while
        # the ranks compute the next step, instead of delaying its plan.
        asyncio.get_running_loop().call_soon(self._notify, trace, stats)

    def _notify(self, trace, stats) -> None:
        for obs in self.loop.observers:
            try:
                obs.on_step(trace)
                for s in stats:
                    obs.on_request_finished(s)
            except Exception:  # noqa: BLE001 -- an observer must never kill the engine
                log.exception("observer %r failed", obs)
