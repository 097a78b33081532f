"""The engine loop: one asyncio task that turns requests into steps on the mesh.

    generate() --inbox--> [1 drain] -> [2 schedule] -> [3 send, 4 gather]
                 <-channel- [6 deliver + observers] <- [5 update]

One driver (_drive) at a pipeline depth of 1 (lockstep) or 2 (async scheduling: 3 of step
N+1 before 4-6 of step N). Only 3-4 await. Any exception in the loop (EngineDead or a bug)
ends every request with finish_reason "error" and leaves the engine dead: later generate()
calls answer with an error at once, unless recovery is on (engine/recovery.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from dspark_loop.contract.errors import EngineDead
from dspark_loop.engine.detokenize import Detokenizer, TokenText, output_text
from dspark_loop.engine.device_time import DeviceTime
from dspark_loop.engine.engine_stats import cache_stats, dspark_summary, fits
from dspark_loop.engine.interfaces import MeshClient
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.output_channel import OutputChannel, deliver
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput, error_output
from dspark_loop.engine.recovery import carry_over, wait_for_work
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduled_step import ScheduledStep
from dspark_loop.engine.scheduler import Scheduler
from dspark_loop.engine.step_pipe import StepPipe
from dspark_loop.engine.step_trace import StepTimes, request_stats, step_trace

log = logging.getLogger(__name__)
# NOTE: a step allocates and frees thousands of small objects (token lists, outputs). At
# CPython's default gen0 threshold (700) the collector ran every step at 256 requests (0.1-0.3
# ms) and its older-generation passes paused the loop for 10-20 ms; almost all of them die by
# reference count long before 50,000 net allocations (tools/bench/host: no collection in 300
# steps, max host time 23.6 -> 2.4 ms at K=7).
GC_THRESHOLDS = (50_000, 50, 100)


class EngineLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        mesh: MeshClient,
        tokenizer,
        observers: list[EngineObserver] | None = None,
        async_scheduling: bool = True,
        stream_interval: int = 1,
    ):
        # async_scheduling: plan step N+1 while the ranks run step N (docs/architecture.md
        # "Async scheduling")
        self.async_scheduling = async_scheduling
        self.stream_interval = stream_interval  # tokens per consumer wakeup (output_channel.py)
        self.scheduler = scheduler
        self.mesh = mesh
        self.token_text = TokenText(tokenizer) if tokenizer is not None else None
        self.observers = list(observers or [])
        self._channels: dict[str, OutputChannel] = {}
        self._inbox: list[Request] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._dead_reason: str | None = None
        self._stopping = False
        self.num_steps = 0
        self.on_mesh_dead: Callable[[str, int], Coroutine[Any, Any, None]] | None = None  # recovery
        self._restarting: str | None = None
        self._last_result_at = 0.0  # perf_counter() when the last gathered step's results came in
        self.device_time = DeviceTime()  # per step: the device's busy and the host's blocked time

    # ---- public ------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            gc.set_threshold(*GC_THRESHOLDS)
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._fail_all("the engine stopped")

    @property
    def ready(self) -> bool:
        return self._task is not None and self.dead_reason is None and self.restarting is None and not self._stopping

    @property
    def dead_reason(self) -> str | None:
        # NOTE: the mesh's idle watcher notices a rank that died between steps; /health
        # must say 503 then too, not only after the next step fails.
        if self._dead_reason or self._stopping or self.on_mesh_dead is not None:
            return self._dead_reason
        return self.mesh.dead

    @property
    def restarting(self) -> str | None:
        """Why the ranks are being restarted (None when not): a recoverable death."""
        if self._dead_reason or self._stopping or self.on_mesh_dead is None:
            return None
        return self._restarting or self.mesh.dead

    def resume(self, mesh: MeshClient, scheduler: Scheduler) -> None:
        """A fresh mesh and scheduler (empty pools) after a restart; the kept requests wait
        in the inbox, ahead of those that arrived meanwhile."""
        self.mesh, self.scheduler = mesh, scheduler
        self._restarting = None
        self._task = None
        self.start()

    def give_up(self, reason: str) -> None:
        """No restart after all: the engine is dead and every request ends with an error."""
        self._dead_reason = reason
        self._restarting = None
        self._fail_all(reason)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting + len(self._inbox)

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def capacity_problem(self, prompt_len: int, max_tokens: int) -> str | None:
        """Why such a request could never fit a partition's pages (None: it can)."""
        return fits(self.scheduler, prompt_len, max_tokens)

    def cache_stats(self) -> dict:
        """Read-only: pages, queues and streams (engine/engine_stats.py)."""
        return cache_stats(self.scheduler, len(self._channels), self.num_steps)

    def dspark_summary(self) -> dict:
        """DSpark (K=7) totals so far (engine/engine_stats.py)."""
        return dspark_summary(self.scheduler)

    async def generate(self, g: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        if self.dead_reason is not None or self._stopping:
            yield error_output(g.request_id, f"the engine is not running: {self.dead_reason or 'stopped'}")
            return
        if g.request_id in self._channels:
            yield error_output(g.request_id, f"duplicate request id {g.request_id!r}")
            return
        try:
            det = text = None
            if self.token_text is not None:
                det = Detokenizer(
                    self.token_text, g.params.stop, g.params.include_stop_str_in_output, g.params.skip_special_tokens
                )
            if det is not None and det.plain:
                # NOTE: without stop strings the text cannot end the request: it is decoded
                # here, by the consumer, once per take (the engine's step only moves ids)
                det, text = None, det
            req = self.scheduler.make_request(g, det)
        except ValueError as e:
            yield error_output(g.request_id, str(e), len(g.prompt_token_ids))
            return
        channel = OutputChannel(self.stream_interval)
        self._channels[g.request_id] = channel
        self._inbox.append(req)
        self._wakeup.set()
        finished = False
        try:
            while not finished:
                out = await channel.take()
                finished = out.finished
                if text is not None:
                    out.new_text = output_text(text, out, g.params.include_stop_str_in_output)
                yield out
        finally:
            if not finished:  # the consumer went away (aclose / cancellation)
                self.abort(g.request_id)

    def abort(self, request_id: str) -> bool:
        """Abort now: the request's pages go back to the pool before this returns."""
        if self._channels.pop(request_id, None) is None:
            return False
        self._wakeup.set()  # freed pages may let a waiting request in
        for i, r in enumerate(self._inbox):
            if r.request_id == request_id:
                del self._inbox[i]
                return True
        return self.scheduler.abort(request_id)

    # ---- the loop ------------------------------------------------------------------------
    @property
    def overlaps(self) -> bool:
        """Whether steps are planned one ahead (async scheduling)."""
        return self.async_scheduling

    def _drain_inbox(self) -> None:
        """Step 1: new requests join the scheduler (aborts were applied when they happened)."""
        inbox, self._inbox = self._inbox, []
        for req in inbox:
            try:
                self.scheduler.add(req)
            except ValueError as e:
                self._deliver([error_output(req.request_id, str(e), req.prompt_len)])

    async def _run(self) -> None:
        pipe = StepPipe(self.mesh, self.device_time)
        try:
            await self._drive(pipe)
        except asyncio.CancelledError:
            raise
        except EngineDead as e:
            pipe.close()
            if self.on_mesh_dead is None or self._stopping:
                log.error("engine dead: %s", e)
                self._dead_reason = str(e)
                self._fail_all(str(e))
            else:
                self._begin_restart(str(e))
        except Exception as e:  # noqa: BLE001 -- any failure ends the engine, as data
            pipe.close()
            reason = f"{type(e).__name__}: {e}"
            log.exception("engine loop died: %s", reason)
            self._dead_reason = reason
            self._fail_all(reason)

    async def _drive(self, pipe: StepPipe) -> None:
        """The driver, at a pipeline depth of 1 (lockstep: plan, send, gather, apply) or 2
        (async scheduling: plan and send step N+1, then gather, apply and deliver step N; the
        ranks start N+1 as soon as they finish N, while the host applies N)."""
        sched = self.scheduler
        ahead = self.overlaps
        sent: tuple[ScheduledStep, StepTimes] | None = None  # sent, not yet gathered (depth 2)
        while not self._stopping:
            self._drain_inbox()
            if sent is None and not sched.has_work:
                sched.check_integrity()
                self._wakeup.clear()
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
            self._deliver(outputs)
            times.delivered()
            self._observe(step, [], times)
            if completed:
                continue  # the requests that sat this step out can run now
            if not outputs:
                # nothing could run (e.g. every queue waits on pages): do not spin
                self._wakeup.clear()
                await self._wakeup.wait()
            else:
                await asyncio.sleep(0)  # let consumers and new requests in

    async def _complete(self, pipe: StepPipe, step: ScheduledStep, times: StepTimes) -> None:
        """Gather, update, deliver and observe a sent step."""
        if self.overlaps:
            times.gather_from()
            results = await pipe.gather(step.step_id)
        else:
            results = await self._step_mesh(step, pipe)
        times.waited()
        outputs = self.scheduler.update(step, results)
        times.updated()
        self._deliver(outputs)
        times.delivered()
        self.num_steps += 1
        if results and self.scheduler.observes_steps:
            self._observe_cost(step, results, times)
        self._last_result_at = times.result_at
        self._observe(step, results, times)

    def _observe_cost(self, step: ScheduledStep, results, times: StepTimes) -> None:
        """The verify policy learns the step's cost."""
        if not self.overlaps:
            # NOTE: the host's share is its own thread's CPU time (schedule, update,
            # deliver): like the ranks' work_s, immune to other processes on the cores
            self.scheduler.observe_step(step, results, times.span_s, times.host_cpu_s)
            return
        # NOTE: the ranks' own work times are the step's cost (the host's work overlaps
        # them). Without them, the wall time from when the ranks could start it (its
        # send, or the previous result, whichever came later) to its result: a mesh that
        # computes inside send() (in-process) makes that wall time another step's.
        wall_s = times.result_at - max(times.plan_end, self._last_result_at)
        self.scheduler.observe_step(step, results, wall_s, overlapped=True)

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
        masks = self.scheduler.late_masks(step)
        step.masks_s = time.perf_counter() - t0
        await pipe.send_masks(masks)

    async def _idle_wait(self) -> None:
        """Wait for work; with recovery on, also notice a mesh that died while idle."""
        self.device_time.pause()
        await wait_for_work(self._wakeup, self.mesh, self.on_mesh_dead is not None)

    def _begin_restart(self, reason: str) -> None:
        """Recovery (engine/recovery.py): the running requests end with an error, the waiting
        ones go back to the inbox, and the supervisor restarts the ranks."""
        restart = self.on_mesh_dead
        assert restart is not None, "only a loop with recovery restarts"
        self._restarting = reason
        outputs, waiting, num_failed = carry_over(self.scheduler, reason)
        self._deliver(outputs)
        self._inbox[:0] = [r for r in waiting if r.request_id in self._channels]
        log.warning(
            "rank mesh died (%s): %d running request(s) failed, %d waiting kept", reason, num_failed, len(self._inbox)
        )
        self._task = None
        asyncio.get_running_loop().create_task(restart(reason, num_failed), name="mesh-restart")

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        deliver(self._channels, outputs)

    def _fail_all(self, reason: str) -> None:
        for request_id, channel in list(self._channels.items()):
            req = self.scheduler.requests.get(request_id)
            n_prompt = req.prompt_len if req else 0
            n_out = len(req.output_ids) if req else 0
            channel.put(error_output(request_id, reason, n_prompt, n_out))
        self._channels.clear()
        self._inbox.clear()

    def _observe(self, step: ScheduledStep, results, times: StepTimes) -> None:
        if not self.observers:
            return
        trace = step_trace(self.scheduler, step, results, self.num_waiting, times)
        trace.device_busy_s, trace.host_blocked_s = self.device_time.take(step.step_id)
        stats = [request_stats(r) for r in step.finished]
        # NOTE: the trace is the state after this step; the observers (metrics, the tap's
        # encode + send: ~0.1-0.25 ms at 256 requests) run at the loop's next yield, while
        # the ranks compute the next step, instead of delaying its plan.
        asyncio.get_running_loop().call_soon(self._notify, trace, stats)

    def _notify(self, trace, stats) -> None:
        for obs in self.observers:
            try:
                obs.on_step(trace)
                for s in stats:
                    obs.on_request_finished(s)
            except Exception:  # noqa: BLE001 -- an observer must never kill the engine
                log.exception("observer %r failed", obs)
