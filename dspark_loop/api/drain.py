"""Drain: what SIGTERM and SIGINT mean to a serving process.

    SIGTERM, or a first SIGINT   stop admitting (new requests 503, /health 503 "draining"),
                                 let admitted requests finish for up to timeout_s, then
                                 set `stop` (the engine then ends the rest with an error
                                 event, the ranks are shut down, exit code 0)
    SIGINT during a drain        set `stop` now (Ctrl-C twice)
    SIGTERM during a drain       nothing new: the drain goes on to its deadline

This is the orchestrators' contract (Kubernetes sends SIGTERM, waits its grace period,
then SIGKILLs): keep --shutdown-timeout below that grace period.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

log = logging.getLogger(__name__)


class Drain:
    def __init__(self, gate, timeout_s: float, stop: asyncio.Event):
        self.gate = gate  # AdmissionGate: .draining, .num_active, wait_idle()
        self.timeout_s = timeout_s
        self.stop = stop
        self._task: asyncio.Task | None = None

    def on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._task is None:
            self.gate.draining = True
            log.info(
                "%s: draining: no new requests; %d running may finish within %g s",
                name,
                self.gate.num_active,
                self.timeout_s,
            )
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="drain")
        elif sig == signal.SIGINT:
            log.warning("SIGINT again: stopping now; %d request(s) end with an error", self.gate.num_active)
            self.stop.set()

    async def _drain(self) -> None:
        t0 = time.monotonic()
        if await self.gate.wait_idle(self.timeout_s):
            log.info("drained in %.2f s", time.monotonic() - t0)
        else:
            log.warning(
                "drain timed out after %g s; %d request(s) end with an error", self.timeout_s, self.gate.num_active
            )
        self.stop.set()
