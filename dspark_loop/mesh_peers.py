"""The ROUTER's doorkeeper: who has proven the secret, over which connection, and who is gone.

    Knock from a known identity        -> answer(): a Challenge with a fresh server nonce
    Hello / NodeHello                  -> admit(): the mac must sign it with that nonce
    any other frame                    -> is_admitted(): only from the connection that said
                                          Hello (an identity cannot be taken over)
    the monitor's DISCONNECTED(fd)     -> closed(): the admitted peer on that connection is lost

A connection is told by its file descriptor (zmq SRCFD on every received frame, the value
of the monitor's DISCONNECTED event), which is how a closed TCP connection names its
peer: a SIGKILLed or unplugged node is noticed in milliseconds (heartbeats close a silent
one), not when a collective times out. Torch-free.
"""
from __future__ import annotations

from dspark_loop.mesh_auth import SECRET_ENV, is_signed, new_nonce, server_proof
from dspark_loop.protocol import Challenge, Knock


def peer_name(peer: bytes) -> str:
    """b"rank3" -> "rank 3", b"node1" -> "node 1"'s agent."""
    text = peer.decode(errors="replace")
    for kind in ("rank", "node"):
        if text.startswith(kind) and text[len(kind):].isdigit():
            return f"{kind} {text[len(kind):]}" + ("'s agent" if kind == "node" else "")
    return repr(peer)


class Peers:
    def __init__(self, secret: str, identities: set[bytes]) -> None:
        self.secret = secret
        self.identities = identities  # who may knock at all
        self.admitted: dict[bytes, int] = {}  # peer -> the fd of its connection
        self.lost: list[bytes] = []  # admitted peers whose connection closed, in order
        self._nonces: dict[bytes, bytes] = {}
        self._fd_to_peer: dict[int, bytes] = {}

    def answer(self, sender: bytes, knock: Knock) -> Challenge | None:
        if sender not in self.identities:
            return None
        nonce = new_nonce()
        self._nonces[sender] = nonce  # NOTE: a second knock replaces the first one's nonce
        return Challenge(knock.client_nonce, nonce,
                         server_proof(self.secret, knock.client_nonce, nonce))

    def admit(self, sender: bytes, fd: int, msg) -> str | None:
        """None when msg (a Hello or NodeHello) is signed with this peer's nonce, else why not."""
        nonce = self._nonces.pop(sender, None)
        if nonce is None:
            return (f"{peer_name(sender)} said Hello without knocking first (an older "
                    f"version, or not one of ours): refused")
        if not is_signed(msg, self.secret, nonce):
            return (f"{peer_name(sender)} failed authentication: its {SECRET_ENV} differs "
                    f"from node 0's: refused")
        old_fd = self.admitted.get(sender)
        if old_fd is not None:
            self._fd_to_peer.pop(old_fd, None)
        self.admitted[sender] = fd
        self._fd_to_peer[fd] = sender
        return None

    def is_admitted(self, sender: bytes, fd: int) -> bool:
        return self.admitted.get(sender) == fd

    def closed(self, fd: int) -> bytes | None:
        """The admitted peer whose connection `fd` was, now lost; None for any other fd."""
        peer = self._fd_to_peer.pop(fd, None)
        if peer is None or self.admitted.get(peer) != fd:
            return None
        del self.admitted[peer]
        self.lost.append(peer)
        return peer
