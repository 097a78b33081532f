"""The start-up handshake's rules: who may join the mesh, and the pool size it agrees on.

A rank's DEALER identity is b"rank<R>" on both sides; its Hello must come from that socket,
speak this server's protocol version, name the same world and serve node 0's checkpoint.
A node agent (b"node<I>", nodes.py) must also run node 0's flags. RollCall keeps node 0's
start-up books: who said Hello, which nodes joined, why one was refused. Torch-free.
"""

from __future__ import annotations

import msgspec

from dspark_loop.contract.checkpoint_fingerprint import short
from dspark_loop.contract.errors import MeshStartError
from dspark_loop.contract.protocol import PROTOCOL_VERSION, Hello, NodeHello, RankConfig, Refused, Welcome, identity
from dspark_loop.mesh.nodes import NODE_LOCAL_FIELDS, NodeLayout, agent_identity, missing_message


def hello_problem(hello: Hello, sender: bytes, world_size: int, seen: set[int], fingerprint: str = "") -> str | None:
    """Why this Hello must stop the start-up, or None (fingerprint "": not compared)."""
    if hello.protocol_version != PROTOCOL_VERSION:
        return (
            f"rank {hello.rank} speaks protocol version {hello.protocol_version}, "
            f"the server speaks {PROTOCOL_VERSION}: refused"
        )
    if hello.error:
        return f"rank {hello.rank} failed to start: {hello.error}"
    if hello.world_size != world_size or not 0 <= hello.rank < world_size:
        return f"rank {hello.rank} of {hello.world_size} joined a mesh of {world_size} ranks"
    if sender != identity(hello.rank):
        return f"rank {hello.rank} said Hello from socket {sender!r}"
    if hello.rank in seen:
        return f"rank {hello.rank} said Hello twice"
    if fingerprint and hello.fingerprint != fingerprint:
        return (
            f"rank {hello.rank} serves another checkpoint (fingerprint "
            f"{short(hello.fingerprint)}) than node 0 ({short(fingerprint)}): refused"
        )
    return None


def node_problem(
    hello: NodeHello, sender: bytes, nodes: NodeLayout, rank_cfg: RankConfig, fingerprint: str, joined: set[int]
) -> str | None:
    """Why node 0 must refuse this node agent, or None."""
    node = hello.node_rank
    if hello.protocol_version != PROTOCOL_VERSION:
        return (
            f"node {node} speaks protocol version {hello.protocol_version}, node 0 speaks "
            f"{PROTOCOL_VERSION}: run the same dspark_loop version on every node"
        )
    if hello.nnodes != nodes.nnodes or not 1 <= node < nodes.nnodes:
        return (
            f"node {node} was started with --nnodes {hello.nnodes} --node-rank {node}, "
            f"node 0 with --nnodes {nodes.nnodes}"
        )
    if sender != agent_identity(node):
        return f"node {node} said Hello from socket {sender!r}"
    if node in joined:
        return f"node {node} is already in the mesh (two hosts started with --node-rank {node}?)"
    if hello.fingerprint != fingerprint:
        return (
            f"node {node} serves another checkpoint (fingerprint {short(hello.fingerprint)}) "
            f"than node 0 ({short(fingerprint)}): config.json or the tensor names differ; "
            f"every node must serve the same checkpoint"
        )
    try:
        theirs = RankConfig.decode(hello.rank_config)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return f"node {node} sent a rank configuration node 0 cannot read: {e}"
    diffs = [
        f"{name} {getattr(theirs, name)!r} (node 0: {getattr(rank_cfg, name)!r})"
        for name in RankConfig.__struct_fields__
        if name not in NODE_LOCAL_FIELDS and getattr(theirs, name) != getattr(rank_cfg, name)
    ]
    if diffs:
        return (
            f"node {node} was started with other flags than node 0: {', '.join(diffs)}; "
            f"start every node with the same model flags"
        )
    return None


def min_num_blocks(hellos: list[Hello]) -> list[int]:
    families = {len(h.num_blocks) for h in hellos}
    if len(families) != 1:
        raise MeshStartError(f"ranks disagree on the number of cache families: {sorted(families)}")
    return [min(col) for col in zip(*(h.num_blocks for h in hellos))]


class RollCall:
    """Node 0's start-up books: one per start()."""

    def __init__(self, nodes: NodeLayout, rank_cfg: RankConfig, fingerprint: str) -> None:
        self.nodes, self.rank_cfg, self.fingerprint = nodes, rank_cfg, fingerprint
        self.hellos: dict[int, Hello] = {}
        self.joined: set[int] = set()
        self.refusals: dict[int, str] = {}  # node -> why it was last refused

    @property
    def complete(self) -> bool:
        return len(self.hellos) == self.nodes.world_size

    def node_hello(self, sender: bytes, hello: NodeHello) -> Welcome | Refused:
        problem = node_problem(hello, sender, self.nodes, self.rank_cfg, self.fingerprint, self.joined)
        if problem:
            self.refusals[hello.node_rank] = problem
            return Refused(problem)
        self.joined.add(hello.node_rank)
        self.refusals.pop(hello.node_rank, None)
        return Welcome(hello.node_rank)

    def hello(self, sender: bytes, hello: Hello) -> None:
        """Count a rank's Hello; MeshStartError when it must stop the start-up."""
        problem = hello_problem(hello, sender, self.nodes.world_size, set(self.hellos), self.fingerprint)
        if problem:
            if self.nodes.nnodes > 1 and 0 <= hello.rank < self.nodes.world_size:
                problem += f" (rank {hello.rank} is on node {self.nodes.node_of(hello.rank)})"
            raise MeshStartError(problem)
        self.hellos[hello.rank] = hello

    def timeout_message(self, timeout_s: float, node_command: str, auth_refusals: dict[bytes, str]) -> str:
        refusals = dict(self.refusals)
        for node in self.nodes.remote_nodes:
            if agent_identity(node) in auth_refusals:
                refusals.setdefault(node, auth_refusals[agent_identity(node)])
        return missing_message(self.nodes, set(self.hellos), self.joined, timeout_s, node_command, refusals)
