"""The server's side of the rank mesh: one ZMQ ROUTER, one DEALER per rank. Torch-free.

    Mesh (ROUTER, tcp://host:port)                       rank r (DEALER, identity rank<r>)
      start():  spawn this node's ranks   <-------------  Knock / Challenge (mesh_auth.py)
                admit other nodes' agents <-------------  NodeHello (node agents, nodes.py)
                wait for N Hellos         <-------------  Hello(version, num_blocks | error)
      send():   the plan, encoded once, to all  ------->  StepPlan   (step() = send + gather;
      gather(): one result per rank             <-------  StepResult  two may be in flight)
      close():  Shutdown to all, then SIGTERM/SIGKILL stragglers, reap

Only peers that proved the mesh secret are heard (mesh_socket.py). ROUTER_MANDATORY makes a
send to a rank that is not connected an error instead of a silent drop, and the Hello
travels on the same DEALER, so a rank that said Hello is routable. Liveness: a rank of this
host that exits or is stopped (SIGSTOP; looked at in a step, step_gather.py, and every
WATCH_S while idle), a rank or node agent of another host whose connection closes (or whose
agent reports an exit), a rank that answers with an error or misses step_timeout_s: each
makes the mesh dead: `dead` says why, every rank of this host is killed, the other nodes'
agents are told to stop theirs (and to rejoin the next mesh when `rejoin_on_death()` says
a restart will follow, supervisor.py), and step() raises EngineDead.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import secrets
import shlex
from collections.abc import Callable

import msgspec
import zmq

from dspark_loop.contract.errors import EngineDead
from dspark_loop.contract.mesh_auth import SECRET_ENV
from dspark_loop.contract.protocol import (
    ENCODER,
    RankConfig,
    RankExited,
    Shutdown,
    StepMasks,
    StepPlan,
    StepResult,
    identity,
)
from dspark_loop.mesh.handshake import min_num_blocks
from dspark_loop.mesh.nodes import NodeLayout, free_port
from dspark_loop.mesh.peers import remote_loss
from dspark_loop.mesh.procs import RankProcs, rank_env
from dspark_loop.mesh.router_socket import MeshSocket, listen
from dspark_loop.mesh.startup import await_hellos
from dspark_loop.mesh.step_gather import POLL_S, StepGather

log = logging.getLogger("dspark_loop.mesh.mesh")

WATCH_S = 0.5  # how often the idle watcher looks at the rank processes (a step: POLL_S)


class Mesh:
    """rank_cfg: what every rank is told (the Mesh fills in the addresses after bind()).
    launch=False: the ranks are started elsewhere (by hand) with rank_argv(r) (bind()
    first to learn it) and DSPARK_MESH_SECRET=mesh.secret in their environment; liveness
    then rests on step_timeout_s. env: extra environment for spawned ranks. nodes: the
    ranks of other hosts (their agents join; nodes.py); port / dist_port: fixed ports
    (--dist-init-addr) instead of free ones. secret: the mesh secret (fresh when None)."""

    def __init__(
        self,
        rank_cfg: RankConfig,
        step_timeout_s: float = 60.0,
        start_timeout_s: float = 600.0,
        host: str = "127.0.0.1",
        launch: bool = True,
        env: dict[str, str] | None = None,
        nodes: NodeLayout | None = None,
        port: int = 0,
        dist_port: int = 0,
        secret: str | None = None,
    ) -> None:
        if rank_cfg.world_size % rank_cfg.tp:
            raise ValueError(f"tp {rank_cfg.tp} does not divide world size {rank_cfg.world_size}")
        self.rank_cfg = rank_cfg
        self.world_size, self.tp = rank_cfg.world_size, rank_cfg.tp
        self.step_timeout_s, self.start_timeout_s = step_timeout_s, start_timeout_s
        self.host, self.launch, self.env = host, launch, env or {}
        self.nodes = nodes or NodeLayout(world_size=self.world_size)
        self.port, self.dist_port = port, dist_port
        self.secret = secret or secrets.token_hex(32)
        self.num_blocks: list[int] = []  # per cache family, min over ranks (after start)
        self.procs = RankProcs()
        self.address = ""  # tcp://host:port of the ROUTER (after bind)
        self.dist_init = ""  # tcp://host:port of the torch.distributed rendezvous
        self.socket: MeshSocket | None = None
        self.remote_exits: list[RankExited] = []  # other nodes' ranks that exited (agents say)
        self._agents_told = False  # Shutdown sent to the other nodes' agents
        self._dead: str | None = None
        self._started = False
        self._closing = False
        self._in_step = False  # a step watches the ranks itself; the idle watcher stands down
        self._gather = StepGather(self)
        self._watcher: asyncio.Task | None = None
        self._close_task: asyncio.Future | None = None
        # whether the other nodes' agents should rejoin the next mesh after a death (the
        # supervisor sets it when a restart will follow); otherwise they exit 1
        self.rejoin_on_death: Callable[[], bool] = lambda: False

    @property
    def num_groups(self) -> int:
        return self.world_size // self.tp

    @property
    def dead(self) -> str | None:
        return self._dead

    @property
    def pids(self) -> list[int]:
        return self.procs.pids

    # ---- start-up -----------------------------------------------------------------------
    def bind(self) -> None:
        """Open the ROUTER and pick the rendezvous port (start() does it if not done yet)."""
        if self.socket is not None:
            return
        peers = {identity(r) for r in range(self.world_size)} | set(self.nodes.agent_identities)
        self.socket, self.address = listen(self.secret, peers, self.host, self.port)
        self.dist_init = f"tcp://{self.host}:{self.dist_port or free_port(self.host)}"
        self.rank_cfg = msgspec.structs.replace(
            self.rank_cfg, connect=self.address, dist_init=self.dist_init, parent_pid=os.getpid() if self.launch else 0
        )
        if not self.launch:
            log.info(
                "start each rank R with %s set to this mesh's secret: python -m workers %s",
                SECRET_ENV,
                shlex.join(self.rank_argv(0)).replace("--rank 0", "--rank R", 1),
            )

    def rank_argv(self, rank: int) -> list[str]:
        """`python -m workers` arguments for one rank (after bind())."""
        return ["--rank", str(rank), "--config", self.rank_cfg.encode()]

    async def start(self) -> None:
        self.bind()
        if self.launch:
            env = rank_env({**os.environ, **self.env, SECRET_ENV: self.secret}, self.rank_cfg.threads)
            local = self.nodes.ranks_of(0)
            self.procs.spawn([self.rank_argv(r) for r in local], env, first_rank=local.start)
            atexit.register(self.procs.kill_now)
        try:
            hellos = await await_hellos(self, POLL_S)
            self.num_blocks = min_num_blocks(hellos)
        except BaseException as exc:
            self._dead = (
                "start-up interrupted" if isinstance(exc, asyncio.CancelledError) else f"start-up failed: {exc}"
            )
            await self._shutdown(grace_s=0.0)
            raise
        self._started = True
        log.info(
            "mesh ready: %d ranks on %d node(s) (tp %d, %d groups), num_blocks %s, slowest load %.2f s",
            self.world_size,
            self.nodes.nnodes,
            self.tp,
            self.num_groups,
            self.num_blocks,
            max(h.load_s for h in hellos),
        )
        self._watcher = asyncio.create_task(self._watch())

    def remote_loss_reason(self) -> str | None:
        """Why another node counts as lost (an agent or rank connection closed), or None."""
        self.socket.poll_lost()
        return remote_loss(self.nodes, self.socket.peers.lost, self.remote_exits)

    # ---- the step -------------------------------------------------------------------------
    async def step(self, plan: StepPlan) -> list[StepResult]:
        """Send one plan to every rank; the TP leaders' results in partition order."""
        await self.send(plan)
        return await self.gather(plan.step_id)

    async def send(self, plan: StepPlan) -> None:
        """The plan, encoded once, to every rank. With async scheduling a second plan may be
        sent before the first one's results are gathered: a rank runs its plans in order."""
        await self._broadcast(plan)

    async def send_masks(self, masks: StepMasks) -> None:
        """The masks a sent plan left out (masks_follow), to every rank: before any later plan."""
        await self._broadcast(masks)

    async def _broadcast(self, msg: StepPlan | StepMasks) -> None:
        self.raise_if_over()
        if not self._started:
            raise EngineDead("the mesh is not started")
        frame = ENCODER.encode(msg)
        for rank in range(self.world_size):
            try:
                await self.socket.send_frame(identity(rank), frame)
            except zmq.ZMQError as exc:
                await self.die(
                    self.procs.exit_reason()
                    or self.remote_loss_reason()
                    or f"could not send step {msg.step_id} to rank {rank}: {exc}"
                )

    async def gather(self, step_id: int) -> list[StepResult]:
        """The TP leaders' results of a sent step, in partition order (steps in send order)."""
        self._in_step = True
        try:
            return await self._gather.gather(step_id)
        finally:
            self._in_step = False

    def raise_if_over(self) -> None:
        """EngineDead once the mesh is dead or closing."""
        if self._dead or self._closing:
            raise EngineDead(self._dead or "the mesh is closing")

    async def recv(self, timeout_s: float):
        """(sender, message) from an admitted peer, or None after timeout_s."""
        try:
            return await self.socket.recv(timeout_s)
        except (zmq.ZMQError, AttributeError):
            if self._closing:  # close() shut the socket under a waiting step
                raise EngineDead(self._dead or "the mesh is closing") from None
            raise

    async def send_to(self, peer: bytes, msg) -> None:
        """One message to one connected peer (a peer that is gone is logged, not raised)."""
        try:
            await self.socket.send(peer, msg)
        except zmq.ZMQError as exc:  # that peer is not connected (any more)
            log.warning("could not send %s to %r: %s", type(msg).__name__, peer, exc)

    # ---- liveness and shutdown --------------------------------------------------------------
    async def _watch(self) -> None:
        """Notices a dead rank or a lost node while no step is running (so /health can say 503)."""
        while not self._dead and not self._closing:
            await asyncio.sleep(WATCH_S)
            reason = self.procs.exit_reason() or self.procs.hang_reason() or self.remote_loss_reason()
            if reason and not self._closing and not self._in_step:
                try:
                    await self.die(reason)
                except EngineDead:
                    return

    async def die(self, reason: str):
        """The mesh is dead (the first reason wins): every rank is killed; raises EngineDead."""
        if self._dead is None and not self._closing:
            self._dead = reason
            rejoin = self.rejoin_on_death()
            log.error(
                "rank mesh dead: %s; killing every rank%s",
                reason,
                " (other nodes rejoin the next mesh)" if rejoin else "",
            )
            # NOTE: a remote rank stuck in a collective hears nothing: its agent stops it.
            await self._tell_agents(Shutdown(f"rank mesh dead: {reason}", grace_s=0.0, error=True, rejoin=rejoin))
            await self.procs.kill()  # NOTE: a dead mesh has nothing to save; a stopped rank ignores SIGTERM
            self.procs.log_exits()
        raise EngineDead(self._dead or "the mesh is closing")

    async def _tell_agents(self, msg: Shutdown) -> None:
        """Once: the agents stop their ranks (a rank stuck in a collective hears nothing)."""
        if not self._agents_told:
            self._agents_told = True
            for agent in self.nodes.agent_identities:
                if agent in self.socket.peers.admitted:
                    await self.send_to(agent, msg)

    async def close(self, grace_s: float = 5.0) -> None:
        """Shut the ranks down in order (Shutdown, then SIGTERM/SIGKILL after grace_s).
        Safe to call twice, concurrently, or from a signal path; the first call's grace wins."""
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._shutdown(grace_s))
        await asyncio.shield(self._close_task)

    async def _shutdown(self, grace_s: float) -> None:
        self._closing = True
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
        if self.socket is not None:
            if self._started and not self._dead:
                for rank in range(self.world_size):
                    await self.send_to(identity(rank), Shutdown("server closing"))
            failed = self._dead is not None and self._dead != "closed"
            await self._tell_agents(Shutdown(self._dead or "server closing", grace_s=grace_s, error=failed))
        await self.procs.stop(grace_s)
        self.procs.log_exits()
        atexit.unregister(self.procs.kill_now)
        if self.socket is not None:
            # NOTE: closing at once could drop the agents' Shutdown with the socket.
            await self.socket.wait_gone(self.nodes.agent_identities, grace_s + 3.0)
            self.socket.close()
            self.socket = None
        self._dead = self._dead or "closed"
