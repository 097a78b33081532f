"""A node other than node 0 (`--node-rank I`, I > 0): runs this host's ranks for node 0.

    agent (DEALER b"node<I>")                    node 0's Mesh (ROUTER at --dist-init-addr port+1)
      Knock, NodeHello(checkpoint, RankConfig) -->  secret, protocol, checkpoint and flags checked
                                               <--  Welcome | Refused(reason): print it, exit 2
      spawn ranks I*L .. (I+1)*L-1 (each knocks and says Hello to node 0 itself)
      RankExited(rank, how)                    -->  a rank of ours died
                                               <--  Shutdown: stop the ranks; exit 0 (closed)
                                                    or 1 (error=True: the mesh failed)
                                               <--  Shutdown(rejoin=True), or node 0's connection
                                                    closed: stop the ranks, wait for node 0 again

No API server, engine or tokenizer here. Either node may start first: the agent knocks
until node 0 answers, for at most --dist-timeout seconds (exit 1 after that).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from dspark_loop.config.rank_config import rank_config
from dspark_loop.config.server_config import ServerConfig
from dspark_loop.contract.checkpoint_fingerprint import checkpoint_fingerprint
from dspark_loop.contract.mesh_auth import SECRET_ENV, resolve_secret
from dspark_loop.contract.mesh_join import KNOCK_RETRY_S, JoinError, Knocker
from dspark_loop.contract.protocol import (
    AGENT_DECODER,
    ENCODER,
    PROTOCOL_VERSION,
    Challenge,
    NodeHello,
    RankConfig,
    RankExited,
    Refused,
    Shutdown,
    Welcome,
)
from dspark_loop.mesh.nodes import NodeLayout, agent_identity, mesh_endpoints, parse_host_port
from dspark_loop.mesh.procs import RankProcs, describe_exit, rank_env

log = logging.getLogger("dspark_loop.node")

POLL_S = 0.2
HEARTBEAT_MS = (1000, 5000)  # ZMTP ping interval, and silence after which a peer is gone


def agent_socket(ctx: zmq.asyncio.Context, node_rank: int, address: str):
    """(DEALER connected to node 0, its monitor for DISCONNECTED)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, agent_identity(node_rank))
    sock.setsockopt(zmq.LINGER, 1000)  # the last NodeHello / RankExited still leaves
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS[0])
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_MS[1])
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(address)
    return sock, monitor


class NodeAgent:
    def __init__(self, cfg: ServerConfig, rank_cfg: RankConfig, secret: str) -> None:
        self.cfg = cfg
        self.layout = NodeLayout(cfg.nnodes, cfg.node_rank, cfg.world_size)
        host, port = parse_host_port(cfg.dist_init_addr)
        dist_init, self.address = mesh_endpoints(host, port)
        self.rank_cfg = msgspec.structs.replace(
            rank_cfg,
            connect=self.address,
            dist_init=dist_init,
            parent_pid=os.getpid(),
            first_rank=self.layout.local_ranks.start,
        )
        self.secret = secret
        self.knocker = Knocker(secret, f"node 0 at {self.address}")
        self.fingerprint = checkpoint_fingerprint(cfg.model)
        self.procs = RankProcs()
        self.stop = asyncio.Event()  # SIGINT/SIGTERM

    @property
    def node_hello(self) -> NodeHello:
        return NodeHello(
            PROTOCOL_VERSION,
            self.cfg.node_rank,
            self.cfg.nnodes,
            self.fingerprint,
            self.rank_cfg.encode(),
            pid=os.getpid(),
        )

    async def run(self) -> int:
        """The process's exit code: 0 closed by node 0 (or a signal), 1 the mesh failed or
        node 0 never answered, 2 refused."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        ctx = zmq.asyncio.Context()
        try:
            while not self.stop.is_set():
                sock, monitor = agent_socket(ctx, self.cfg.node_rank, self.address)
                try:
                    if not await self.join(sock):
                        return 0  # stopped by a signal while waiting
                    self.spawn()
                    code = await self.serve(sock, monitor)
                finally:
                    await self.procs.stop(0.0)  # NOTE: serve() gave them their grace already
                    self.procs.log_exits()
                    self.procs = RankProcs()
                    monitor.close(linger=0)
                    sock.close()
                if code is not None or self.stop.is_set():
                    return code or 0
                log.warning("waiting up to %.0f s for node 0 to start a new mesh", self.cfg.dist_timeout_s)
            return 0
        except JoinError as e:
            print(f"error: node {self.cfg.node_rank}: {e}", file=sys.stderr)
            return 2
        except TimeoutError as e:
            print(f"error: node {self.cfg.node_rank}: {e}", file=sys.stderr)
            return 1
        finally:
            ctx.destroy(linger=0)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def join(self, sock) -> bool:
        """Knock until node 0 answers, then NodeHello until Welcome; False if stopped.
        Raises JoinError (refused, wrong secret) or TimeoutError (node 0 never answered)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.dist_timeout_s
        next_knock = 0.0
        while not self.stop.is_set():
            now = loop.time()
            if now >= deadline:
                raise TimeoutError(
                    f"{self.knocker.server} did not answer within {self.cfg.dist_timeout_s:.0f} s: "
                    f"is node 0 started (same flags, --node-rank 0) and is "
                    f"{self.cfg.dist_init_addr} reachable from here?"
                )
            if now >= next_knock:
                await sock.send(ENCODER.encode(self.knocker.knock()))
                next_knock = now + KNOCK_RETRY_S
            msg = await recv(sock, min(POLL_S, max(0.0, next_knock - now)))
            if isinstance(msg, Challenge):
                try:
                    if not self.knocker.accepts(msg):
                        continue
                except JoinError:
                    # NOTE: still say Hello, so node 0's log names the node with the wrong secret.
                    await sock.send(ENCODER.encode(self.knocker.sign(self.node_hello, msg)))
                    raise
                await sock.send(ENCODER.encode(self.knocker.sign(self.node_hello, msg)))
                next_knock = loop.time() + KNOCK_RETRY_S  # Welcome should come at once
            elif isinstance(msg, Welcome):
                log.info(
                    "node %d joined node 0 at %s; starting ranks %s",
                    self.cfg.node_rank,
                    self.address,
                    list(self.layout.local_ranks),
                )
                return True
            elif isinstance(msg, Refused):
                raise JoinError(f"node 0 refused this node: {msg.reason}")
        return False

    def spawn(self) -> None:
        env = rank_env({**os.environ, SECRET_ENV: self.secret}, self.rank_cfg.threads)
        argvs = [["--rank", str(r), "--config", self.rank_cfg.encode()] for r in self.layout.local_ranks]
        self.procs.spawn(argvs, env, first_rank=self.layout.local_ranks.start)

    async def serve(self, sock, monitor) -> int | None:
        """Watch the ranks and node 0 until told to stop: the exit code (0 closed, 1 the mesh
        failed), or None to join node 0's next mesh (node 0 lost, or asked to rejoin)."""
        reported: set[int] = set()
        while await monitor.poll(0, zmq.POLLIN):  # events of connections before the Welcome
            await monitor.recv_multipart()
        while not self.stop.is_set():
            if await monitor.poll(0, zmq.POLLIN):
                parse_monitor_message(await monitor.recv_multipart())
                log.error("node 0 lost: its connection closed; stopping this node's ranks")
                return None
            msg = await recv(sock, POLL_S)
            if isinstance(msg, Shutdown):
                log.log(
                    logging.ERROR if msg.error else logging.INFO,
                    "node 0 shut the mesh down: %s",
                    msg.reason or "no reason given",
                )
                await self.procs.stop(msg.grace_s)
                if msg.rejoin:
                    return None
                if msg.error:
                    print(f"error: node {self.cfg.node_rank}: node 0's mesh failed: {msg.reason}", file=sys.stderr)
                return 1 if msg.error else 0
            for rank, code in self.procs.exited():
                if rank not in reported:
                    reported.add(rank)
                    log.error("rank %d exited with %s", rank, describe_exit(code))
                    await sock.send(ENCODER.encode(RankExited(rank, describe_exit(code))))
        return 0


async def recv(sock, timeout_s: float):
    """One decoded frame from node 0, or None after timeout_s (malformed frames dropped)."""
    if not await sock.poll(int(timeout_s * 1000), zmq.POLLIN):
        return None
    frame = await sock.recv()
    try:
        return AGENT_DECODER.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("dropped a malformed frame from node 0: %s", exc)
        return None


async def run_node(cfg: ServerConfig) -> int:
    """`python -m dspark_loop --node-rank I` for I > 0: the agent's exit code."""
    return await NodeAgent(cfg, rank_config(cfg), resolve_secret(cfg.nnodes)[0]).run()
