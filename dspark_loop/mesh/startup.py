"""Node 0's start-up roll call: wait until every rank said Hello (and every other node's
agent was admitted or refused), or say why not. Torch-free.

    await_hellos(mesh, poll_s)
      NodeHello -> Welcome | Refused (RollCall, mesh_handshake.py)
      Hello     -> counted; RankExited / a local exit / a lost node -> MeshStartError
      past mesh.start_timeout_s (--dist-timeout) -> which node never joined, and how to start it

X
forget_peer/auth_refusals and its processes (mesh.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from dspark_loop.contract.checkpoint_fingerprint import checkpoint_fingerprint
from dspark_loop.contract.errors import MeshStartError
from dspark_loop.contract.protocol import Hello, NodeHello, RankExited, Refused
from dspark_loop.mesh.handshake import RollCall
from dspark_loop.mesh.nodes import node_command

if TYPE_CHECKING:
    from dspark_loop.mesh.mesh import Mesh

log = logging.getLogger("dspark_loop.mesh.mesh")

EXIT_GRACE_S = 1.0  # a rank's Hello(error) may trail its exit: wait this long for the why


def _fingerprint(mesh: Mesh) -> str:
    try:
        return checkpoint_fingerprint(mesh.rank_cfg.model)
    except (OSError, ValueError):
        return ""  # no readable checkpoint: the ranks' own load error will say why


async def await_hellos(mesh: Mesh, poll_s: float) -> list[Hello]:
    """Every rank's Hello in rank order; raises MeshStartError. poll_s: how often the wait
    looks at the rank processes and the other nodes' connections."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + mesh.start_timeout_s
    sock = mesh.socket
    assert sock is not None  # start() binds first
    roll = RollCall(mesh.nodes, mesh.rank_cfg, _fingerprint(mesh))
    exit_seen_at: float | None = None
    while not roll.complete:
        got = await mesh.recv(poll_s)
        if got is not None:
            sender, msg = got
            if isinstance(msg, NodeHello):
                answer = roll.node_hello(sender, msg)
                log.log(
                    logging.INFO if msg.node_rank in roll.joined else logging.ERROR,
                    "node %d: %s",
                    msg.node_rank,
                    answer.reason if isinstance(answer, Refused) else "joined",
                )
                await mesh.send_to(sender, answer)
                if isinstance(answer, Refused):
                    sock.peers.forget(sender)  # a refused agent is not heard again
            elif isinstance(msg, Hello):
                roll.hello(sender, msg)
                log.info(
                    "rank %d ready (pid %d, load %.2f s, num_blocks %s)", msg.rank, msg.pid, msg.load_s, msg.num_blocks
                )
            elif isinstance(msg, RankExited):
                raise MeshStartError(
                    f"rank {msg.rank} on node {mesh.nodes.node_of(msg.rank)} exited with {msg.how} before its Hello"
                )
            else:
                log.warning("dropped %s from %r during start-up", type(msg).__name__, sender)
            continue
        now = loop.time()
        reason = mesh.procs.exit_reason() or mesh.remote_loss_reason()
        # NOTE: a failing rank sends Hello(error) and then exits; give its message a
        # moment to arrive so the error says why rather than only "exited with code 2".
        if reason:
            if exit_seen_at is None:
                exit_seen_at = now
            if now - exit_seen_at > EXIT_GRACE_S:
                raise MeshStartError(f"{reason} before its Hello")
        if now >= deadline:
            raise MeshStartError(
                roll.timeout_message(
                    mesh.start_timeout_s,
                    node_command(mesh.nodes.nnodes, mesh.host, mesh.dist_port),
                    sock.refusals,
                )
            )
    return [roll.hellos[r] for r in range(mesh.world_size)]
