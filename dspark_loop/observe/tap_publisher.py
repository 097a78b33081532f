"""The debug tap (--debug-tap ADDR): one msgpack StepTrace per engine step on a ZMQ
publisher, for `python -m tools.tap`. Publishing never blocks or slows the engine loop:

    on_step(trace) --no subscriber--> skipped, not even encoded (costs one poll)
                   --queue full-----> dropped, counted (StepTrace.dropped_traces)
                   --otherwise------> ENCODER.encode(trace) -> send(NOBLOCK)
"""

from __future__ import annotations

import logging
import re
import time

import msgspec
import zmq

from dspark_loop.contract.protocol import ENCODER, MeshRestart, StepTrace
from dspark_loop.engine.observer import EngineObserver

log = logging.getLogger(__name__)


ADDRESS = re.compile(r"(tcp://[^\s:/]+:(\d+|\*)|ipc://\S+|inproc://\S+)")


def tap_address(addr: str) -> str:
    """The ZeroMQ address of a tap, for --debug-tap and `tools.tap --connect` alike:
    '5599' or ':5599' -> tcp://127.0.0.1:5599 (loopback unless the address names a host);
    'host:5599' -> tcp://host:5599; tcp://, ipc:// and inproc:// addresses as given.
    Raises ValueError for anything else."""
    if "://" not in addr:
        host, _, port = addr.rpartition(":")
        addr = f"tcp://{host or '127.0.0.1'}:{port}"
    if not ADDRESS.fullmatch(addr):
        raise ValueError(
            f"must be a port (5599), host:port or a ZeroMQ address like tcp://127.0.0.1:5599 (got {addr!r})"
        )
    return addr


class TapPublisher(EngineObserver):
    def __init__(self, addr: str, sndhwm: int = 128):
        self.addr = tap_address(addr)
        self.sndhwm = sndhwm
        self.num_sent = 0
        self.num_dropped = 0  # the queue was full
        self.num_skipped = 0  # nobody was listening
        self.num_subscriptions = 0
        self._ctx = zmq.Context.instance()
        # NOTE: XPUB, not PUB: a PUB socket drops silently at the high-water mark, so drops
        # could not be counted; XPUB_NODROP turns "full" into EAGAIN (we drop and count), and
        # the subscription messages XPUB hands us say whether anyone is listening at all.
        # One stalled viewer therefore stalls the tap for every viewer: it is a debug tool.
        sock = self._ctx.socket(zmq.XPUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, sndhwm)
        sock.setsockopt(zmq.XPUB_NODROP, 1)
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscribe, so we can count them
        try:
            sock.bind(self.addr)
        except zmq.ZMQError:
            sock.close(0)
            raise
        self.bound_addr = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sock: zmq.Socket | None = sock
        log.info("debug tap publishing StepTraces at %s", self.bound_addr)

    @property
    def has_subscribers(self) -> bool:
        self._drain_subscriptions()
        return self.num_subscriptions > 0

    def on_step(self, trace: StepTrace) -> None:
        if self._sock is None:
            return
        if not self.has_subscribers:
            self.num_skipped += 1
            return
        # the engine's trace is shared with other observers: stamp a copy
        trace = msgspec.structs.replace(trace, dropped_traces=self.num_dropped)
        try:
            self._sock.send(ENCODER.encode(trace), zmq.NOBLOCK)
            self.num_sent += 1
        except zmq.Again:
            self.num_dropped += 1

    def on_mesh_restart(self, event: MeshRestart) -> None:
        """One StepTrace that carries the restart (step_id -1: no step ran)."""
        self.on_step(
            StepTrace(
                step_id=-1,
                wall_time=time.time(),
                mesh_restart=event,
                errors=[f"rank mesh restarted in {event.restart_s:.2f} s: {event.reason}"],
            )
        )

    def _drain_subscriptions(self) -> None:
        sock = self._sock
        while sock is not None and sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            msg = sock.recv(zmq.NOBLOCK)
            if msg[:1] == b"\x01":
                self.num_subscriptions += 1
            elif msg[:1] == b"\x00":
                self.num_subscriptions = max(0, self.num_subscriptions - 1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
            log.info(
                "debug tap closed: %d sent, %d dropped, %d skipped", self.num_sent, self.num_dropped, self.num_skipped
            )
