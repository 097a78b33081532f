"""One rank process: load a shard, say Hello, then run every StepPlan it is sent.

    server ROUTER  <--- DEALER (identity b"rank<R>") ---  this process
        Hello ------------------------------------------>  (once, after loading)
        StepPlan --->  execute(plan.partitions[group])  --->  StepResult
        Shutdown --->  exit 0

Every rank executes every step (the expert exchange is collective); only TP leaders send
tokens. A frame that does not decode is logged and dropped. A failed step is answered
with StepResult(error=...) and the process exits: the engine is dead anyway, and a rank
left half-way through a collective cannot be trusted with the next one.
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import msgspec
import numpy as np
import zmq

from dspark_loop.protocol import (ENCODER, PROTOCOL_VERSION, RANK_DECODER, Hello, Shutdown,
                                  StepPlan, StepResult, f32, i32)

log = logging.getLogger("workers.rank")

DEFAULT_RUNNER = "workers.runner:ModelRunner"


def identity(rank: int) -> bytes:
    return b"rank%d" % rank


@dataclass
class RankArgs:
    rank: int
    world_size: int
    tp: int
    connect: str  # tcp://host:port of the server's ROUTER
    dist_init: str  # tcp://host:port of the torch.distributed rendezvous (rank 0 hosts it)
    model: str
    dtype: str = "bfloat16"
    block_size: int = 32
    num_blocks: int | None = None
    kv_cache_memory: int | None = None  # bytes
    backend: str = "cpu"
    device_id: int = 0
    threads: int = 1
    parent_pid: int = 0  # 0: started by hand, nobody to watch
    runner: str = DEFAULT_RUNNER  # module:Class
    dist_timeout_s: float = 600.0
    spec_k: int = 0  # DSpark: 0 or 7 (7 loads the drafter and its rings)
    num_leases: int = 0  # drafter leases per TP group (max_num_seqs // dp)
    max_model_len: int = 1 << 30  # the position ceiling (the drafter skips anchors past it)


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
    def __init__(self, args: RankArgs) -> None:
        self.args = args
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, identity(args.rank))
        self.sock.setsockopt(zmq.LINGER, 5000)  # flush the last result/Hello, then give up
        self.sock.connect(args.connect)
        self.runner = None
        self.is_leader = args.rank % args.tp == 0
        self.group = args.rank // args.tp

    def load(self) -> None:
        import torch

        from workers.backend import select_backend, torch_dtype
        from workers.comm import ShardSpec
        from workers.dist_comm import GlooComm, init_distributed

        a = self.args
        torch.set_num_threads(max(1, a.threads))
        backend = select_backend(a.backend, a.device_id)
        backend.activate()
        shard = ShardSpec(rank=a.rank, world_size=a.world_size, tp_size=a.tp)
        groups = init_distributed(shard, a.dist_init, backend.dist_backend, a.dist_timeout_s)
        comm = GlooComm(shard, groups[shard.group])
        runner_cls = load_runner_class(a.runner)
        spec = {"spec_k": a.spec_k, "num_leases": a.num_leases, "max_model_len": a.max_model_len} \
            if a.spec_k else {}
        self.runner = runner_cls(a.model, torch_dtype(a.dtype), shard, comm, a.block_size,
                                 num_blocks=a.num_blocks, kv_cache_memory=a.kv_cache_memory,
                                 device=str(backend.device), **spec)

    def send(self, msg) -> None:
        self.sock.send(ENCODER.encode(msg))

    def hello(self, load_s: float, error: str = "") -> None:
        num_blocks = [] if error else [int(n) for n in self.runner.num_blocks]
        self.send(Hello(PROTOCOL_VERSION, self.args.rank, self.args.world_size, os.getpid(),
                        num_blocks=num_blocks, error=error, load_s=load_s))

    def run_step(self, plan: StepPlan) -> StepResult:
        if len(plan.partitions) != self.args.world_size // self.args.tp:
            raise ValueError(f"plan has {len(plan.partitions)} partitions, the mesh has "
                             f"{self.args.world_size // self.args.tp} TP groups")
        t0 = time.perf_counter()
        tokens = self.runner.execute(plan.partitions[self.group])
        compute_s = time.perf_counter() - t0
        token_ids = np.ascontiguousarray(tokens, dtype=np.int32).tobytes() if self.is_leader else b""
        result = StepResult(plan.step_id, self.args.rank, token_ids, compute_s)
        take = getattr(self.runner, "take_drafts", None)
        drafts = take() if take is not None else None
        if drafts is not None and self.is_leader:
            req_ids, tokens7, conf = drafts
            result.draft_req_ids = i32(req_ids)
            result.draft_token_ids = i32(tokens7)
            result.draft_confidence = f32(conf)
        return result

    def serve(self) -> int:
        """The step loop; returns the process exit code."""
        while True:
            frame = self.sock.recv()
            try:
                msg = RANK_DECODER.decode(frame)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("dropped a malformed frame (%d bytes): %s", len(frame), exc)
                continue
            if isinstance(msg, Shutdown):
                log.info("shutdown (%s)", msg.reason or "no reason given")
                return 0
            try:
                result = self.run_step(msg)
            except Exception as exc:
                log.exception("step %d failed", msg.step_id)
                self.send(StepResult(msg.step_id, self.args.rank, error=summarize(exc)))
                return 1
            self.send(result)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def run(args: RankArgs) -> int:
    # NOTE: the server owns shutdown: Ctrl-C on its terminal must not kill ranks before it
    # has sent Shutdown. SIGTERM/SIGKILL keep their default (die now).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.parent_pid:
        watch_parent(args.parent_pid)
    rank = Rank(args)
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
    rank.hello(load_s)
    try:
        code = rank.serve()
    finally:
        _destroy_process_group()
        rank.close()
    return code


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
