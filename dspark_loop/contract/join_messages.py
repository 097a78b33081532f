"""The messages of joining the mesh (contract/mesh_auth.py, mesh/nodes.py): every peer (a
rank or a node agent) knocks before its Hello; node agents are admitted or refused.

Wire rules as protocol.py's (array_like: field order IS the wire format; the tags are
unique across every message in protocol.py's unions, which include these).
"""

from __future__ import annotations

import msgspec


class Knock(msgspec.Struct, array_like=True, tag=6):
    """peer (rank or node agent) -> server: please send a Challenge."""

    client_nonce: bytes


class Challenge(msgspec.Struct, array_like=True, tag=7):
    """server -> peer: the nonce to sign the Hello with, and proof the server has the secret."""

    client_nonce: bytes  # echoed: a peer that knocked again ignores stale challenges
    server_nonce: bytes
    proof: bytes


class NodeHello(msgspec.Struct, array_like=True, tag=8):
    """node agent (node_rank > 0) -> node 0, before its ranks load: may it join?"""

    protocol_version: int
    node_rank: int
    nnodes: int
    fingerprint: str  # checkpoint_fingerprint() of the node's checkpoint
    rank_config: str  # the node's RankConfig as JSON, compared field by field
    pid: int = 0
    mac: bytes = b""


class Welcome(msgspec.Struct, array_like=True, tag=9):
    """node 0 -> node agent: admitted; start the node's ranks."""

    node_rank: int


class Refused(msgspec.Struct, array_like=True, tag=10):
    """node 0 -> node agent: not admitted, and why (the agent prints it and exits)."""

    reason: str


class RankExited(msgspec.Struct, array_like=True, tag=11):
    """node agent -> node 0: one of its ranks exited without being told to (a crash before
    its Hello would otherwise only show as a start-up timeout)."""

    rank: int
    how: str  # "code 2", "signal SIGKILL"
