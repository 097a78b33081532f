"""Ranks on several hosts: which node runs which ranks, and where node 0 listens.

    --nnodes 2 --dist-init-addr 10.0.0.1:5000, world size 16, tp 4:

    node 0 (API server, engine)    ranks 0..7    TP groups 0, 1
    node 1 (agent)                 ranks 8..15   TP groups 2, 3

    tcp://10.0.0.1:5000   torch.distributed rendezvous (rank 0's TCPStore, on node 0)
    tcp://10.0.0.1:5001   the mesh's ZeroMQ ROUTER (plans, results, Hello; node agents)

Node i runs the world_size/nnodes consecutive ranks from i*world_size/nnodes, so a TP
group never spans nodes when tp divides that count (the Flash shapes: 8 ranks per node).
Torch-free.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

MESH_PORT_OFFSET = 1  # the ROUTER listens on the --dist-init-addr port + 1
# RankConfig fields that may differ between nodes (everything else must be equal).
# NOTE: model is the path on that host; the checkpoint itself is compared by fingerprint.
NODE_LOCAL_FIELDS = (
    "model",
    "devices",
    "threads",
    "log_level",
    "connect",
    "dist_init",
    "parent_pid",
    "first_rank",
    "kv_cache_memory",
    "gpu_memory_utilization",
    "num_blocks",
    "dist_timeout_s",
)


@dataclass(frozen=True)
class NodeLayout:
    nnodes: int = 1
    node_rank: int = 0
    world_size: int = 1

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    def ranks_of(self, node: int) -> range:
        n = self.ranks_per_node
        return range(node * n, (node + 1) * n)

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    @property
    def local_ranks(self) -> range:
        return self.ranks_of(self.node_rank)

    @property
    def remote_nodes(self) -> range:
        """The nodes node 0 waits for (none on a one-host run)."""
        return range(1, self.nnodes)

    @property
    def agent_identities(self) -> list[bytes]:
        """The DEALER identities of the other nodes' agents."""
        return [agent_identity(n) for n in self.remote_nodes]


def agent_identity(node_rank: int) -> bytes:
    """A node agent's DEALER identity (a rank's is protocol.identity)."""
    return b"node%d" % node_rank


def free_port(host: str) -> int:
    """A TCP port nothing listens on now (the rendezvous's, when --dist-init-addr gives none)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_host_port(text: str) -> tuple[str, int]:
    """ "HOST:PORT" -> (host, port); ValueError says what is wrong. The ROUTER takes port + 1."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"must be HOST:PORT, e.g. 10.0.0.1:5000 (got {text!r})")
    if "[" in host or ":" in host:
        raise ValueError(f"must be an IPv4 address or a host name with a port (got {text!r})")
    port = int(port_text)
    if not 1 <= port <= 65535 - MESH_PORT_OFFSET:
        raise ValueError(f"port must be 1..{65535 - MESH_PORT_OFFSET}: the mesh also uses the next port (got {port})")
    return host, port


def mesh_endpoints(host: str, port: int) -> tuple[str, str]:
    """(torch.distributed init method, the ROUTER's address) for --dist-init-addr HOST:PORT."""
    return f"tcp://{host}:{port}", f"tcp://{host}:{port + MESH_PORT_OFFSET}"


def node_command(nnodes: int, host: str, port: int) -> str:
    """How to start another node ({node} left to fill), for start-up messages."""
    return (
        f"python -m dspark_loop --nnodes {nnodes} --node-rank {{node}} "
        f"--dist-init-addr {host}:{port} <node 0's model flags>"
    )


def rank_list(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def missing_message(
    layout: NodeLayout,
    said_hello: set[int],
    joined: set[int],
    timeout_s: float,
    node_command: str,
    refusals: dict[int, str],
) -> str:
    """Why start-up gave up: per node, the ranks that did not say Hello and the likely cause.

    joined: the remote nodes whose agent was admitted; refusals: node -> its last refusal."""
    missing = sorted(set(range(layout.world_size)) - said_hello)
    if layout.nnodes == 1:
        return f"ranks {missing} did not say Hello within {timeout_s:.0f} s (loading too slowly or hung?)"
    parts = []
    for node in range(layout.nnodes):
        ranks = [r for r in missing if layout.node_of(r) == node]
        if not ranks:
            continue
        if node == 0:
            parts.append(
                f"ranks {rank_list(ranks)} on node 0 (this host) did not say Hello (loading too slowly or hung?)"
            )
        elif node not in joined:
            why = f" (last attempt refused: {refusals[node]})" if node in refusals else ""
            parts.append(
                f"node {node} (ranks {rank_list(layout.ranks_of(node))}) never joined"
                f"{why}: start `{node_command.format(node=node)}` there"
            )
        else:
            parts.append(
                f"node {node} joined but its ranks {rank_list(ranks)} did not say Hello (loading too slowly or hung?)"
            )
    return f"within {timeout_s:.0f} s: " + "; ".join(parts)
