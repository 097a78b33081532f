"""The server's ROUTER with its doorkeeper: only peers that proved the secret are heard.

    recv()       the next frame from an admitted peer, or a Hello / NodeHello that was just
                 admitted; Knocks are answered here, everything else is dropped with a log
    send()       to a peer by identity (ROUTER_MANDATORY: an unknown peer is an error)
    poll_lost()  reads the monitor: admitted peers whose TCP connection closed

ZMTP heartbeats close a connection whose peer went silent (a host that lost power), so
poll_lost() also covers a node that vanished without closing anything. Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import cast

import msgspec
import zmq
from zmq.utils.monitor import parse_monitor_message

from dspark_loop.contract.errors import MeshStartError
from dspark_loop.contract.protocol import ENCODER, SERVER_DECODER, Hello, Knock, NodeHello
from dspark_loop.mesh.peers import Peers

log = logging.getLogger("dspark_loop.mesh.mesh")

HEARTBEAT_IVL_MS = 1000  # ZMTP ping every second ...
HEARTBEAT_TIMEOUT_MS = 5000  # ... and a peer silent this long is disconnected
POLLIN, POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
SEND_RETRY_S = 0.001  # a send to a peer whose queue is full, while others have room, retries this often


class MeshSocket:
    def __init__(self, secret: str, identities: set[bytes]) -> None:
        self.peers = Peers(secret, identities)
        self.refusals: dict[bytes, str] = {}  # peer -> why its last Hello was refused
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        # NOTE: the monitor is read with NOBLOCK, so that poll_lost() never awaits: a step
        # and the idle watcher may both call it.
        address = f"inproc://mesh-monitor-{id(self)}"
        self.sock.monitor(address, zmq.EVENT_DISCONNECTED)
        self.monitor = self.ctx.socket(zmq.PAIR)
        self.monitor.connect(address)
        # NOTE: plain (not zmq.asyncio) calls: a step sends a plan to every rank and reads an
        # answer from each, and nearly all of them go through at once. Only a call that must
        # wait awaits, on the socket's FD watched by the event loop (_wait); an empty socket
        # is seen in its EVENTS, not in an EAGAIN raised per read. zmq.asyncio's poll future,
        # poller and exception cost more than the read itself (most of the server's CPU per
        # step at 1 stream, with 16 answers a step).
        self._fd = int(self.sock.getsockopt(zmq.FD))
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop watching _fd (on first wait)
        self._waiters: list[tuple[int, asyncio.Future]] = []  # (POLLIN or POLLOUT, woken with True)

    def bind(self, host: str, port: int = 0) -> str:
        """Listen on host:port (a free port when 0); the address peers connect to."""
        if port:
            self.sock.bind(f"tcp://{host}:{port}")
        else:
            port = self.sock.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{port}"

    async def send(self, peer: bytes, msg) -> None:
        await self.send_frame(peer, ENCODER.encode(msg))

    async def send_frame(self, peer: bytes, frame: bytes) -> None:
        while True:
            try:
                self.sock.send_multipart([peer, frame], zmq.NOBLOCK, copy=False)
                break
            except zmq.Again:  # that peer's queue is full (ROUTER_MANDATORY): wait for room
                if self._events() & POLLOUT:  # room for other peers only: no signal to wait for
                    await asyncio.sleep(SEND_RETRY_S)
                else:
                    await self._wait(POLLOUT, None)
        if self._waiters:  # NOTE: the send may have taken the FD's signal a waiting read needs
            self._events()

    async def recv(self, timeout_s: float):
        """(sender, message) from an admitted peer, or None after timeout_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            # NOTE: nothing half-read: a message is taken whole or not at all
            if not self._events() & POLLIN:
                if loop.time() >= deadline or not await self._wait(POLLIN, deadline):
                    return None
                continue
            try:
                sender, frame = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            sender = sender.bytes
            fd = frame.get(zmq.SRCFD)  # the TCP connection it came on (see mesh_peers.py)
            try:
                msg = SERVER_DECODER.decode(frame.buffer)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("dropped a malformed frame from %r: %s", sender, exc)
                continue
            if isinstance(msg, Knock):
                await self._answer(sender, msg)
            elif isinstance(msg, (Hello, NodeHello)):
                problem = self.peers.admit(sender, fd, msg)
                if problem is None:
                    return sender, msg
                log.error("%s", problem)
                self.refusals[sender] = problem
            elif self.peers.is_admitted(sender, fd):
                return sender, msg
            else:
                log.warning(
                    "dropped a %s from %r: that peer has not said an authenticated Hello", type(msg).__name__, sender
                )

    async def _answer(self, sender: bytes, knock: Knock) -> None:
        challenge = self.peers.answer(sender, knock)
        if challenge is None:
            log.warning("ignored a knock from %r: not a peer of this mesh", sender)
            return
        try:
            await self.send(sender, challenge)
        except zmq.ZMQError as exc:  # it knocked and left
            log.warning("could not answer the knock of %r: %s", sender, exc)

    def poll_lost(self) -> list[bytes]:
        """Admitted peers whose connection closed since the last call (also in peers.lost)."""
        lost = []
        while True:
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return lost
            peer = self.peers.closed(event["value"])
            if peer is not None:
                lost.append(peer)

    async def wait_gone(self, peers: list[bytes], timeout_s: float) -> None:
        """Wait up to timeout_s until none of `peers` is connected and admitted any more."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(p in self.peers.admitted for p in peers) and loop.time() < deadline:
            self.poll_lost()
            await asyncio.sleep(0.05)

    def _events(self) -> int:
        """The socket's ZMQ EVENTS; wakes the waiters it satisfies. NOTE: the FD signals
        edge-triggered: any call on the socket (this one included) may take the signal, so
        whoever reads EVENTS tells the waiters what it saw."""
        events = cast(int, self.sock.getsockopt(zmq.EVENTS))
        if self._waiters:
            still = []
            for flag, fut in self._waiters:
                if fut.done():
                    continue
                if events & flag:
                    fut.set_result(True)
                else:
                    still.append((flag, fut))
            self._waiters = still
        return events

    async def _wait(self, flag: int, deadline: float | None) -> bool:
        """Until the socket may have `flag` (True) or the loop's clock passes deadline (False)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            loop.add_reader(self._fd, self._events)
            self._loop = loop
        fut = loop.create_future()
        self._waiters.append((flag, fut))
        timer = loop.call_at(deadline, _time_up, fut) if deadline is not None else None
        try:
            if self._events() & flag:  # NOTE: a signal taken before this waiter was listed
                return True
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            if not fut.done():
                fut.cancel()

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None
        for _, fut in self._waiters:
            if not fut.done():
                fut.cancel()
        self._waiters = []
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)
        self.ctx.term()


def _time_up(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)


def listen(secret: str, identities: set[bytes], host: str, port: int = 0) -> tuple[MeshSocket, str]:
    """A MeshSocket listening on host:port (a free port when 0) and its address; a
    MeshStartError naming host:port when it cannot."""
    sock = MeshSocket(secret, identities)
    try:  # NOTE: only on that address: a node 0 with several interfaces hides the rest
        return sock, sock.bind(socket.gethostbyname(host), port)
    except (OSError, zmq.ZMQError) as exc:
        sock.close()
        raise MeshStartError(
            f"cannot listen on {host}:{port}: {exc} (is it an address of this host, and the port free?)"
        ) from None
