"""The server's side of the rank mesh: one ZMQ ROUTER, one DEALER per rank. Torch-free.

    Mesh (ROUTER, tcp://host:port)                       rank r (DEALER, identity rank<r>)
      start():  spawn ranks, wait for N Hellos  <-------  Hello(version, num_blocks | error)
      step():   the plan, encoded once, to all  ------->  StepPlan
                gather one result per rank      <-------  StepResult(tokens | error)
      close():  Shutdown to all, then SIGTERM/SIGKILL stragglers, reap

ROUTER_MANDATORY makes a send to a rank that is not connected an error instead of a
silent drop, and the Hello travels on the same DEALER, so a rank that said Hello is
routable. Liveness: a rank that exits or is stopped (SIGSTOP; polled every 0.2 s in a
step, 0.5 s while idle), answers with an error, or misses step_timeout_s makes the mesh
dead: `dead` says why, every rank is killed, and step() raises EngineDead.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shlex
import socket

import msgspec
import zmq
import zmq.asyncio

from dspark_loop.errors import EngineDead, MeshStartError
from dspark_loop.mesh_handshake import hello_problem, min_num_blocks
from dspark_loop.mesh_procs import RankProcs
from dspark_loop.protocol import (ENCODER, SERVER_DECODER, Hello, RankConfig, Shutdown, StepPlan,
                                  StepResult, identity)

log = logging.getLogger("dspark_loop.mesh")

POLL_S = 0.2  # how often a waiting step looks at the rank processes
WATCH_S = 0.5  # how often the idle watcher does
TROUBLE_WINDOW_S = 0.5  # after a first failure, how long a step collects evidence of its cause


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Mesh:
    """rank_cfg: what every rank is told (the Mesh fills in the addresses after bind()).
    launch=False: the ranks are started elsewhere (other hosts) with rank_argv(r) (bind()
    first to learn it); liveness then rests on step_timeout_s. env: extra environment for
    spawned ranks."""

    def __init__(self, rank_cfg: RankConfig, step_timeout_s: float = 60.0,
                 start_timeout_s: float = 600.0, host: str = "127.0.0.1", launch: bool = True,
                 env: dict[str, str] | None = None) -> None:
        if rank_cfg.world_size % rank_cfg.tp:
            raise ValueError(f"tp {rank_cfg.tp} does not divide world size {rank_cfg.world_size}")
        self.rank_cfg = rank_cfg
        self.world_size, self.tp = rank_cfg.world_size, rank_cfg.tp
        self.step_timeout_s, self.start_timeout_s = step_timeout_s, start_timeout_s
        self.host, self.launch, self.env = host, launch, env or {}
        self.num_blocks: list[int] = []  # per cache family, min over ranks (after start)
        self.procs = RankProcs()
        self.address = ""  # tcp://host:port of the ROUTER (after bind)
        self.dist_init = ""  # tcp://host:port of the torch.distributed rendezvous
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._dead: str | None = None
        self._started = False
        self._closing = False
        self._in_step = False  # a step watches the ranks itself; the idle watcher stands down
        self._watcher: asyncio.Task | None = None
        self._close_task: asyncio.Future | None = None

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
        if self._sock is not None:
            return
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port(f"tcp://{self.host}")
        self.address = f"tcp://{self.host}:{port}"
        self.dist_init = f"tcp://{self.host}:{free_port(self.host)}"
        self.rank_cfg = msgspec.structs.replace(
            self.rank_cfg, connect=self.address, dist_init=self.dist_init,
            parent_pid=os.getpid() if self.launch else 0)
        if not self.launch:
            log.info("start each rank R with: python -m workers %s",
                     shlex.join(self.rank_argv(0)).replace("--rank 0", "--rank R", 1))

    def rank_argv(self, rank: int) -> list[str]:
        """`python -m workers` arguments for one rank (after bind())."""
        return ["--rank", str(rank), "--config", self.rank_cfg.encode()]

    async def start(self) -> None:
        self.bind()
        if self.launch:
            env = {**os.environ, **self.env}
            # NOTE: set before torch is imported in the rank: OpenMP sizes its pool at import.
            env.setdefault("OMP_NUM_THREADS", str(self.rank_cfg.threads))
            self.procs.spawn([self.rank_argv(r) for r in range(self.world_size)], env)
            atexit.register(self.procs.kill_now)
        try:
            hellos = await self._await_hellos()
            self.num_blocks = min_num_blocks(hellos)
        except BaseException as exc:
            self._dead = f"start-up failed: {exc}"
            await self._shutdown(grace_s=0.0)
            raise
        self._started = True
        log.info("mesh ready: %d ranks (tp %d, %d groups), num_blocks %s, slowest load %.2f s",
                 self.world_size, self.tp, self.num_groups, self.num_blocks,
                 max(h.load_s for h in hellos))
        self._watcher = asyncio.create_task(self._watch())

    async def _await_hellos(self) -> list[Hello]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        hellos: dict[int, Hello] = {}
        exit_seen_at = None
        while len(hellos) < self.world_size:
            got = await self._recv(POLL_S)
            if got is not None:
                sender, msg = got
                if not isinstance(msg, Hello):
                    log.warning("dropped %s from %r during start-up", type(msg).__name__, sender)
                    continue
                problem = hello_problem(msg, sender, self.world_size, set(hellos))
                if problem:
                    raise MeshStartError(problem)
                hellos[msg.rank] = msg
                log.info("rank %d ready (pid %d, load %.2f s, num_blocks %s)",
                         msg.rank, msg.pid, msg.load_s, msg.num_blocks)
                continue
            now = loop.time()
            reason = self.procs.exit_reason()
            # NOTE: a failing rank sends Hello(error) and then exits; give its message a
            # moment to arrive so the error says why rather than only "exited with code 2".
            if reason and exit_seen_at is None:
                exit_seen_at = now
            if reason and now - exit_seen_at > 1.0:
                raise MeshStartError(f"{reason} before its Hello")
            if now >= deadline:
                missing = sorted(set(range(self.world_size)) - set(hellos))
                raise MeshStartError(f"ranks {missing} did not say Hello within "
                                     f"{self.start_timeout_s:.0f} s (loading too slowly or hung?)")
        return [hellos[r] for r in range(self.world_size)]

    # ---- the step -------------------------------------------------------------------------
    async def step(self, plan: StepPlan) -> list[StepResult]:
        """Send one plan to every rank; the TP leaders' results in partition order.
        One step at a time: the caller awaits each step before sending the next."""
        if self._dead or self._closing or not self._started:
            raise EngineDead(self._dead or ("the mesh is closing" if self._closing
                                            else "the mesh is not started"))
        self._in_step = True
        try:
            frame = ENCODER.encode(plan)
            for rank in range(self.world_size):
                try:
                    await self._sock.send_multipart([identity(rank), frame], copy=False)
                except zmq.ZMQError as exc:
                    await self._die(self.procs.exit_reason() or
                                    f"could not send step {plan.step_id} to rank {rank}: {exc}")
            return await self._gather(plan.step_id)
        finally:
            self._in_step = False

    async def _gather(self, step_id: int) -> list[StepResult]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.step_timeout_s
        results: dict[int, StepResult] = {}
        errors: list[StepResult] = []  # in arrival order
        trouble_since = None  # first error result or rank exit seen
        while len(results) < self.world_size:
            if self._dead or self._closing:
                raise EngineDead(self._dead or "the mesh is closing")
            got = await self._recv(POLL_S if trouble_since is None else 0.02)
            if got is not None:
                sender, msg = got
                if not isinstance(msg, StepResult) or msg.step_id != step_id:
                    log.warning("dropped a stray %s from %r while waiting for step %d",
                                type(msg).__name__, sender, step_id)
                elif msg.error:
                    errors.append(msg)
                else:
                    results[msg.rank] = msg
            now = loop.time()
            if got is None and (hang := self.procs.hang_reason()):  # quiet for POLL_S: look
                await self._die(f"{hang} during step {step_id}")
            if trouble_since is None and (errors or self.procs.exited()):
                trouble_since = now
            # NOTE: one failure brings a cascade (a killed rank's peers report "connection
            # reset", then exit): collect evidence briefly so the reason names the cause.
            if trouble_since is not None and now - trouble_since >= TROUBLE_WINDOW_S:
                await self._die(self._failure_reason(step_id, errors))
            if now >= deadline:
                missing = sorted(set(range(self.world_size)) - set(results))
                await self._die(f"ranks {missing} did not answer step {step_id} "
                                f"within {self.step_timeout_s:g} s")
        return [results[g * self.tp] for g in range(self.num_groups)]

    def _failure_reason(self, step_id: int, errors: list[StepResult]) -> str:
        """A rank killed by a signal, else the first rank's own error, else the first exit."""
        exited = self.procs.exited()
        if exited and exited[0][1] < 0:
            return f"{self.procs.exit_reason()} during step {step_id}"
        if errors:
            return f"rank {errors[0].rank} failed step {step_id}: {errors[0].error}"
        return f"{self.procs.exit_reason()} during step {step_id}"

    async def _recv(self, timeout_s: float):
        """(sender, message) or None after timeout_s; undecodable frames are dropped."""
        # NOTE: poll then NOBLOCK recv, never a cancelled recv future: nothing is half-read.
        while True:
            try:
                if not await self._sock.poll(int(timeout_s * 1000), zmq.POLLIN):
                    return None
                sender, frame = await self._sock.recv_multipart(zmq.NOBLOCK)
            except (zmq.ZMQError, AttributeError):
                if self._closing:  # close() shut the socket under a waiting step
                    raise EngineDead(self._dead or "the mesh is closing") from None
                raise
            try:
                return sender, SERVER_DECODER.decode(frame)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("dropped a malformed frame from %r: %s", sender, exc)

    # ---- liveness and shutdown --------------------------------------------------------------
    async def _watch(self) -> None:
        """Notices a dead rank while no step is running (so /health can say 503)."""
        while not self._dead and not self._closing:
            await asyncio.sleep(WATCH_S)
            reason = self.procs.exit_reason() or self.procs.hang_reason()
            if reason and not self._closing and not self._in_step:
                try:
                    await self._die(reason)
                except EngineDead:
                    return

    async def _die(self, reason: str):
        if self._dead is None and not self._closing:
            self._dead = reason
            log.error("rank mesh dead: %s; killing every rank", reason)
            await self.procs.kill()  # NOTE: a dead mesh has nothing to save; a stopped rank ignores SIGTERM
            self.procs.log_exits()
        raise EngineDead(self._dead or "the mesh is closing")

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
        if self._sock is not None and self._started and not self._dead:
            for rank in range(self.world_size):
                try:
                    await self._sock.send_multipart([identity(rank), ENCODER.encode(Shutdown("server closing"))])
                except zmq.ZMQError:
                    pass  # that rank is not connected any more: stop() below deals with it
        await self.procs.stop(grace_s)
        self.procs.log_exits()
        atexit.unregister(self.procs.kill_now)
        if self._sock is not None:
            self._sock.close(linger=0)
            self._ctx.term()
            self._sock = None
        self._dead = self._dead or "closed"
