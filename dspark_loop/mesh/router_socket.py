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

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from dspark_loop.contract.errors import MeshStartError
from dspark_loop.contract.protocol import ENCODER, SERVER_DECODER, Hello, Knock, NodeHello
from dspark_loop.mesh.peers import Peers

log = logging.getLogger("dspark_loop.mesh.mesh")

HEARTBEAT_IVL_MS = 1000  # ZMTP ping every second ...
HEARTBEAT_TIMEOUT_MS = 5000  # ... and a peer silent this long is disconnected


class MeshSocket:
    def __init__(self, secret: str, identities: set[bytes]) -> None:
        self.peers = Peers(secret, identities)
        self.refusals: dict[bytes, str] = {}  # peer -> why its last Hello was refused
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        # NOTE: the monitor is read with a plain (not asyncio) socket and NOBLOCK, so that
        # poll_lost() never awaits: a step and the idle watcher may both call it.
        address = f"inproc://mesh-monitor-{id(self)}"
        self.sock.monitor(address, zmq.EVENT_DISCONNECTED)
        self.monitor = zmq.Context.shadow(self.ctx.underlying).socket(zmq.PAIR)
        self.monitor.connect(address)
        # NOTE: the same ROUTER through plain calls: a step sends a plan to every rank and
        # reads an answer from each, and nearly all of them go through at once; the asyncio
        # socket's futures and pollers cost more than the send or read itself (at 16 ranks,
        # most of the server's CPU per step at 1 stream). Only a call that would wait awaits.
        self.plain = zmq.Socket.shadow(self.sock.underlying)

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
        try:
            self.plain.send_multipart([peer, frame], zmq.NOBLOCK, copy=False)
        except zmq.Again:  # that peer's queue is full (ROUTER_MANDATORY): wait for room
            await self.sock.send_multipart([peer, frame], copy=False)

    async def recv(self, timeout_s: float):
        """(sender, message) from an admitted peer, or None after timeout_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            # NOTE: NOBLOCK recv, then poll when nothing is there; never a cancelled recv
            # future: nothing is half-read.
            try:
                sender, frame = self.plain.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                wait_ms = max(0, int((deadline - loop.time()) * 1000))
                if not await self.sock.poll(wait_ms, zmq.POLLIN):
                    return None
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

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)
        self.ctx.term()


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
