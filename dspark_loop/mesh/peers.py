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

from dspark_loop.contract.mesh_auth import SECRET_ENV, is_signed, new_nonce, server_proof
from dspark_loop.contract.protocol import Challenge, Knock, RankExited
from dspark_loop.mesh.nodes import NodeLayout


def peer_name(peer: bytes) -> str:
    """b"rank3" -> "rank 3", b"node1" -> "node 1"'s agent."""
    text = peer.decode(errors="replace")
    for kind in ("rank", "node"):
        if text.startswith(kind) and text[len(kind) :].isdigit():
            return f"{kind} {text[len(kind) :]}" + ("'s agent" if kind == "node" else "")
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
        return Challenge(knock.client_nonce, nonce, server_proof(self.secret, knock.client_nonce, nonce))

    def admit(self, sender: bytes, fd: int, msg) -> str | None:
        """None when msg (a Hello or NodeHello) is signed with this peer's nonce, else why not."""
        nonce = self._nonces.pop(sender, None)
        if nonce is None:
            return (
                f"{peer_name(sender)} said Hello without knocking first (an older version, or not one of ours): refused"
            )
        if not is_signed(msg, self.secret, nonce):
            return f"{peer_name(sender)} failed authentication: its {SECRET_ENV} differs from node 0's: refused"
        old_fd = self.admitted.get(sender)
        if old_fd is not None:
            self._fd_to_peer.pop(old_fd, None)
        self.admitted[sender] = fd
        self._fd_to_peer[fd] = sender
        return None

    def is_admitted(self, sender: bytes, fd: int) -> bool:
        return self.admitted.get(sender) == fd

    def forget(self, peer: bytes) -> None:
        """A refused peer: no longer heard, and its leaving is not a loss."""
        fd = self.admitted.pop(peer, None)
        if fd is not None:
            self._fd_to_peer.pop(fd, None)

    def closed(self, fd: int) -> bytes | None:
        """The admitted peer whose connection `fd` was, now lost; None for any other fd."""
        peer = self._fd_to_peer.pop(fd, None)
        if peer is None or self.admitted.get(peer) != fd:
            return None
        del self.admitted[peer]
        self.lost.append(peer)
        return peer


def node_of_peer(nodes: NodeLayout, peer: bytes) -> int:
    number = int(peer[4:])
    return number if peer.startswith(b"node") else nodes.node_of(number)


def remote_loss(nodes: NodeLayout, lost: list[bytes], exits: list[RankExited]) -> str | None:
    """Why another node counts as lost, or None: its first lost peer (its agent or a rank),
    or better the exit its agent reported for one of its ranks. Peers of node 0 are not
    counted: node 0 sees its own ranks' exit codes."""
    remote = [p for p in lost if node_of_peer(nodes, p) != 0]
    if not remote:
        return None
    node = node_of_peer(nodes, remote[0])
    for e in exits:
        if nodes.node_of(e.rank) == node:
            return f"rank {e.rank} on node {node} exited with {e.how}"
    what = "its agent's" if remote[0].startswith(b"node") else f"{peer_name(remote[0])}'s"
    return f"node {node} lost: {what} connection closed"
