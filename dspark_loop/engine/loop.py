"""The engine loop: one asyncio task that turns requests into steps on the mesh.

    generate() --inbox--> [1 drain] -> [2 schedule] -> [3 send, 4 gather]
                 <-channel- [6 deliver + observers] <- [5 update]

This file is the engine's client API (generate, abort), its requests' channels and inbox,
and its lifecycle (start, stop, recovery's resume and give_up). Steps 1-6 are the step driver
(engine/step_driver.py), at a pipeline depth of 1 (lockstep) or 2 (async scheduling: 3 of
step N+1 before 4-6 of step N). Only 3-4 await. Any exception in the loop (EngineDead or a
bug) ends every request with finish_reason "error" and leaves the engine dead: later
generate() calls answer with an error at once, unless recovery is on (engine/recovery.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from dspark_loop.contract.errors import EngineDead
from dspark_loop.engine.detokenize import Detokenizer, TokenText, output_text
from dspark_loop.engine.device_time import DeviceTime
from dspark_loop.engine.engine_stats import cache_stats, dspark_summary, fits
from dspark_loop.engine.interfaces import MeshClient
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.output_channel import OutputChannel
from dspark_loop.engine.output_channel import deliver as deliver_outputs
from dspark_loop.engine.outputs import GenerateRequest, RequestOutput, error_output
from dspark_loop.engine.recovery import carry_over
from dspark_loop.engine.request import Request
from dspark_loop.engine.scheduler import Scheduler
from dspark_loop.engine.step_driver import StepDriver
from dspark_loop.engine.step_pipe import StepPipe

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
        self.wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._dead_reason: str | None = None
        self._stopping = False
        self.num_steps = 0
        self.on_mesh_dead: Callable[[str, int], Coroutine[Any, Any, None]] | None = None  # recovery
        self._restarting: str | None = None
        self.device_time = DeviceTime()  # per step: the device's busy and the host's blocked time
        self._driver = StepDriver(self)  # steps 1-6 (engine/step_driver.py)

    # ---- public ------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            gc.set_threshold(*GC_THRESHOLDS)
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        self._stopping = True
        self.wakeup.set()
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
                p = g.params
                det = Detokenizer(
                    self.token_text, p.stop, p.include_stop_str_in_output, p.skip_special_tokens, p.keep_special
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
        self.wakeup.set()
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
        self.wakeup.set()  # freed pages may let a waiting request in
        for i, r in enumerate(self._inbox):
            if r.request_id == request_id:
                del self._inbox[i]
                return True
        return self.scheduler.abort(request_id)

    # ---- what the step driver uses; the loop's task and its end ----------------------------
    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def overlaps(self) -> bool:
        """Whether steps are planned one ahead (async scheduling)."""
        return self.async_scheduling

    def drain_inbox(self) -> None:
        """Step 1: new requests join the scheduler (aborts were applied when they happened)."""
        inbox, self._inbox = self._inbox, []
        for req in inbox:
            try:
                self.scheduler.add(req)
            except ValueError as e:
                self.deliver([error_output(req.request_id, str(e), req.prompt_len)])

    async def _run(self) -> None:
        pipe = StepPipe(self.mesh, self.device_time)
        try:
            await self._driver.drive(pipe)
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

    def _begin_restart(self, reason: str) -> None:
        """Recovery (engine/recovery.py): the running requests end with an error, the waiting
        ones go back to the inbox, and the supervisor restarts the ranks."""
        restart = self.on_mesh_dead
        assert restart is not None, "only a loop with recovery restarts"
        self._restarting = reason
        outputs, waiting, num_failed = carry_over(self.scheduler, reason)
        self.deliver(outputs)
        self._inbox[:0] = [r for r in waiting if r.request_id in self._channels]
        log.warning(
            "rank mesh died (%s): %d running request(s) failed, %d waiting kept", reason, num_failed, len(self._inbox)
        )
        self._task = None
        asyncio.get_running_loop().create_task(restart(reason, num_failed), name="mesh-restart")

    def deliver(self, outputs: list[RequestOutput]) -> None:
        deliver_outputs(self._channels, outputs)

    def _fail_all(self, reason: str) -> None:
        for request_id, channel in list(self._channels.items()):
            req = self.scheduler.requests.get(request_id)
            n_prompt = req.prompt_len if req else 0
            n_out = len(req.output_ids) if req else 0
            channel.put(error_output(request_id, reason, n_prompt, n_out))
        self._channels.clear()
        self._inbox.clear()
