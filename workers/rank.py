"""One rank process: load a shard, say Hello, then run every StepPlan it is sent.

    server ROUTER  <--- DEALER (identity b"rank<R>") ---  this process
        Hello ------------------------------------------>  (once, after loading)
        StepPlan --->  execute(plan.partitions[group])  --->  StepResult
        Shutdown --->  exit 0

Every rank executes every step (the expert exchange is collective); only TP leaders answer
it (the host reads nothing else: a peer's collective would stall its leader's answer too).
A frame that does not decode is logged and dropped. A failed step is answered
with StepResult(error=...) and the process exits: the engine is dead anyway, and a rank
left half-way through a collective cannot be trusted with the next one.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from functools import partial

import zmq

from dspark_loop.contract.checkpoint_fingerprint import checkpoint_fingerprint
from dspark_loop.contract.mesh_auth import SecretError, secret_from_env
from dspark_loop.contract.mesh_join import JoinError, Knocker, knock_sync
from dspark_loop.contract.placeholders import LastSamples
from dspark_loop.contract.protocol import (
    ENCODER,
    PROTOCOL_VERSION,
    RANK_DECODER,
    Hello,
    RankConfig,
    Shutdown,
    StepPlan,
    StepResult,
    identity,
)
from workers.late_masks import LateMasks, ShutdownInStep, next_message
from workers.runner_interface import Runner
from workers.step_result import step_result

log = logging.getLogger("workers.rank")


def summarize(exc: BaseException, max_chars: int = 4000) -> str:
    """The exception line and its innermost frames: enough to find the bug from a log."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = "".join(traceback.format_list(frames))
    text = f"{type(exc).__name__}: {exc}\n{where}"
    return text[-max_chars:]


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit this process when the server that spawned it is gone (no orphans).

    NOTE: a thread, not a check in the step loop: the rank may be blocked for a long time
    in a compute or a collective whose peers are alive but whose server has died.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        log.error("server (pid %s) is gone; rank exits", parent_pid)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def load_runner_class(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


class Rank:
    def __init__(self, rank: int, cfg: RankConfig, secret: str) -> None:
        self.rank, self.cfg = rank, cfg
        self.knocker = Knocker(secret, f"the server at {cfg.connect}")
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, identity(rank))
        self.sock.setsockopt(zmq.LINGER, 5000)  # flush the last result/Hello, then give up
        self.sock.connect(cfg.connect)
        self.runner: Runner | None = None
        self.is_leader = rank % cfg.tp == 0
        self.group = rank // cfg.tp
        self.samples = LastSamples()  # resolves the plans' placeholder inputs (async scheduling)
        self.work_clock = time.process_time  # Backend.work_clock once loaded

    def load(self) -> None:
        import torch

        from workers.backend import select_backend
        from workers.comm import ShardSpec
        from workers.dist_comm import GlooComm, init_distributed

        cfg = self.cfg
        torch.set_num_threads(max(1, cfg.threads))
        backend = select_backend(cfg.backend, cfg.device_id(self.rank))
        backend.activate()
        backend.size_runtime(cfg.ring_heap, cfg.weight_bank_size, quiet=self.rank != cfg.first_rank)
        self.work_clock = backend.work_clock()
        shard = ShardSpec(rank=self.rank, world_size=cfg.world_size, tp_size=cfg.tp)
        groups = init_distributed(shard, cfg.dist_init, backend.dist_backend, cfg.dist_timeout_s)
        comm = GlooComm(shard, groups[shard.group])
        self.runner = load_runner_class(cfg.runner)(cfg, shard, comm, str(backend.device))

    def send(self, msg) -> None:
        self.sock.send(ENCODER.encode(msg))

    def hello(self, load_s: float, error: str = "") -> bool:
        """Knock, check the server's proof, say the signed Hello (mesh_auth.py); False (logged)
        when the server did not let this rank join."""
        num_blocks = [] if error else [int(n) for n in self.runner.num_blocks]
        hello = Hello(
            PROTOCOL_VERSION,
            self.rank,
            self.cfg.world_size,
            os.getpid(),
            num_blocks=num_blocks,
            error=error,
            load_s=load_s,
            fingerprint=fingerprint_or_empty(self.cfg.model),
        )
        try:
            challenge = knock_sync(self.sock, self.knocker, RANK_DECODER, self.cfg.dist_timeout_s)
        except JoinError as exc:
            log.error("cannot join the mesh: %s", exc)
            return False
        self.send(self.knocker.sign(hello, challenge))
        return True

    def run_step(self, plan: StepPlan) -> StepResult:
        if len(plan.partitions) != self.cfg.num_groups:
            raise ValueError(
                f"plan has {len(plan.partitions)} partitions, the mesh has {self.cfg.num_groups} TP groups"
            )
        t0, w0 = time.perf_counter(), self.work_clock()
        execute = self.runner.execute
        late = LateMasks(plan.step_id, self.group, self.sock.recv) if plan.masks_follow else None
        if late is not None:  # the runner asks for them just before it samples
            execute = partial(execute, late_masks=late)
        part, tokens = self.samples.run(plan.partitions[self.group], execute)
        if late is not None:
            late()  # NOTE: off the socket even if the runner never sampled: the next frame is the next plan's
        compute_s, work_s = time.perf_counter() - t0, self.work_clock() - w0
        # NOTE: every rank records its drafts: the next plan's placeholders may ask for them (K=7)
        return step_result(
            plan.step_id,
            self.rank,
            tokens,
            self.runner,
            compute_s,
            self.is_leader,
            partial(self.samples.record_drafts, part),
            work_s=work_s,
        )

    def serve(self) -> int:
        """The step loop; returns the process exit code."""
        while True:
            msg = next_message(self.sock.recv)
            if isinstance(msg, Shutdown):
                log.info("shutdown (%s)", msg.reason or "no reason given")
                return 0
            if not isinstance(msg, StepPlan):
                log.warning("dropped a stray %s (no step waits for it)", type(msg).__name__)
                continue
            try:
                result = self.run_step(msg)
            except ShutdownInStep as stop:
                log.info("shutdown during step %d (%s)", msg.step_id, stop)
                return 0
            except Exception as exc:
                failed_at = time.time()
                log.exception("step %d failed", msg.step_id)
                self.send(StepResult(msg.step_id, self.rank, error=summarize(exc), failed_at=failed_at))
                return 1
            if self.is_leader:  # a peer answers only a failure (above)
                self.send(result)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def run(rank_id: int, cfg: RankConfig, rank_cls: type[Rank] = Rank) -> int:
    """rank_cls: Rank, or workers.sim.rank.SimRank (python -m workers picks it for --backend sim)."""
    # NOTE: the server owns shutdown: Ctrl-C on its terminal must not kill ranks before it
    # has sent Shutdown. SIGTERM/SIGKILL keep their default (die now).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cfg.parent_pid:
        watch_parent(cfg.parent_pid)
    try:
        rank = rank_cls(rank_id, cfg, secret_from_env())
    except SecretError as exc:
        log.error("%s", exc)
        return 2
    t0 = time.perf_counter()
    try:
        rank.load()
    except Exception as exc:
        log.exception("rank failed to start")
        rank.hello(time.perf_counter() - t0, error=summarize(exc))
        rank.close()
        return 2
    load_s = time.perf_counter() - t0
    log.info("ready in %.2f s (pid %d, num_blocks %s)", load_s, os.getpid(), rank.runner.num_blocks)
    if not rank.hello(load_s):
        _destroy_process_group()
        rank.close()
        return 2
    try:
        code = rank.serve()
    finally:
        _destroy_process_group()
        rank.close()
    return code


def fingerprint_or_empty(model_dir: str) -> str:
    try:
        return checkpoint_fingerprint(model_dir)
    except (OSError, ValueError):
        return ""  # no readable checkpoint: the load error says why


def _destroy_process_group() -> None:
    dist = sys.modules.get("torch.distributed")  # NOTE: a sim rank never imported it
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()
