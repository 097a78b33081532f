"""A peer's side of joining the mesh (ranks and node agents): knock, check, sign.

    knocker = Knocker(secret, "node 0 at tcp://10.0.0.1:5001")
    send(knocker.knock())                 # again every KNOCK_RETRY_S until answered
    challenge: knocker.accepts(ch)        # False: stale (an older knock); raises JoinError
                                          # when the server cannot prove the secret
    send(knocker.sign(hello, ch))

The protocol itself is in mesh_auth.py; `knock_sync` is the blocking loop a rank uses.
Torch-free.
"""

from __future__ import annotations

import logging
import time

import msgspec
import zmq

from dspark_loop.contract.mesh_auth import SECRET_ENV, new_nonce, same, server_proof, sign
from dspark_loop.contract.protocol import ENCODER, Challenge, Knock

log = logging.getLogger("dspark_loop.mesh.mesh")

KNOCK_RETRY_S = 2.0  # a Knock sent before the server was listening may be lost on reconnect


class JoinError(Exception):
    """The server did not let this peer join (wrong secret, refused, or silent)."""


class Knocker:
    def __init__(self, secret: str, server: str) -> None:
        self.secret, self.server = secret, server
        self.nonce = b""

    def knock(self) -> Knock:
        self.nonce = new_nonce()
        return Knock(self.nonce)

    def accepts(self, challenge: Challenge) -> bool:
        if challenge.client_nonce != self.nonce:
            return False
        if not same(server_proof(self.secret, self.nonce, challenge.server_nonce), challenge.proof):
            raise JoinError(
                f"{self.server} could not prove it has our {SECRET_ENV}: the "
                f"secrets differ (set the same value on every node)"
            )
        return True

    def sign(self, msg, challenge: Challenge):
        return sign(msg, self.secret, challenge.server_nonce)


def knock_sync(sock: zmq.Socket, knocker: Knocker, decoder: msgspec.msgpack.Decoder, timeout_s: float) -> Challenge:
    """Knock on a connected DEALER until a valid Challenge arrives; JoinError on timeout."""
    deadline = time.monotonic() + timeout_s
    next_knock = 0.0
    while True:
        now = time.monotonic()
        if now >= deadline:
            raise JoinError(f"{knocker.server} did not answer within {timeout_s:.0f} s")
        if now >= next_knock:
            sock.send(ENCODER.encode(knocker.knock()))
            next_knock = now + KNOCK_RETRY_S
        if not sock.poll(int(1000 * max(0.01, min(next_knock, deadline) - now))):
            continue
        frame = sock.recv()
        try:
            msg = decoder.decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("dropped a malformed frame while joining: %s", exc)
            continue
        if isinstance(msg, Challenge) and knocker.accepts(msg):
            return msg
        log.debug("ignored %s while joining", type(msg).__name__)
