"""Wiring: config -> mesh (ranks) -> scheduler + engine loop -> HTTP app (or offline).

The HTTP server starts first and answers /health with 503 until the ranks have said
Hello, so a client polling /health sees the server come up.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time

from tokenizers import Tokenizer

from dspark_loop.config.rank_config import rank_config
from dspark_loop.config.server_config import ServerConfig
from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.errors import MeshStartError
from dspark_loop.contract.mesh_auth import resolve_secret
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.scheduler import Scheduler
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.engine.verify.policy import VerifyPolicy
from dspark_loop.event_loop import loop_name
from dspark_loop.mesh.mesh import Mesh
from dspark_loop.mesh.nodes import MESH_PORT_OFFSET, NodeLayout, parse_host_port
from dspark_loop.mesh.restart_budget import RestartBudget
from dspark_loop.mesh.supervisor import MeshSupervisor
from dspark_loop.observe.metrics import Metrics
from dspark_loop.observe.tap_publisher import TapPublisher
from dspark_loop.pending_engine import PendingEngine
from dspark_loop.verify_costs import startup_costs
from dspark_loop.verify_setup import profiles_at_startup, verify_policy

log = logging.getLogger("dspark_loop")


def make_mesh(cfg: ServerConfig) -> Mesh:
    """Node 0's mesh: all ranks, its own spawned; with --dist-init-addr at fixed ports."""
    where = {}
    if cfg.dist_init_addr:
        host, port = parse_host_port(cfg.dist_init_addr)
        where = dict(host=host, port=port + MESH_PORT_OFFSET, dist_port=port)
    return Mesh(
        rank_config(cfg),
        start_timeout_s=cfg.dist_timeout_s,
        nodes=NodeLayout(cfg.nnodes, 0, cfg.world_size),
        secret=resolve_secret(cfg.nnodes)[0],
        **where,
    )


def make_scheduler(
    cfg: ServerConfig,
    model: ModelConfig,
    num_blocks: list[int],
    policy: VerifyPolicy | None = None,
    log_progress: bool = True,
) -> Scheduler:
    """policy: the verify policy (kept across mesh restarts, so a learned cost model is
    too); None: a fresh one from the config. log_progress False: a scheduler that serves
    nobody (the start-up profile's) logs no DSpark progress line."""
    layout = CacheLayout.for_model(model, cfg.block_size)
    return Scheduler(
        layout,
        num_partitions=cfg.dp,
        num_blocks=num_blocks,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        max_model_len=cfg.max_model_len,
        eos_token_ids=model.eos_token_ids,
        log_progress=log_progress,
        **scheduler_extra_kwargs(cfg, policy),
    )


def make_engine(
    cfg: ServerConfig, model: ModelConfig, mesh: Mesh, tokenizer: Tokenizer, observers: list[EngineObserver]
) -> EngineLoop:
    return EngineLoop(
        make_scheduler(cfg, model, mesh.num_blocks),
        mesh,
        tokenizer,
        observers=observers,
        async_scheduling=cfg.async_scheduling,
        stream_interval=cfg.stream_interval,
    )


def scheduler_extra_kwargs(cfg: ServerConfig, policy: VerifyPolicy | None = None) -> dict:
    return {
        "spec_k": cfg.num_speculative_tokens,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "policy": policy if policy is not None else verify_policy(cfg),
    }


def startup_profile(cfg: ServerConfig, model: ModelConfig, policy: VerifyPolicy):
    """prepare(mesh) for the supervisor: the policy's start-up cost table (verify_costs.py)."""
    assert isinstance(policy, AdaptiveVerify)  # profiles_at_startup: adaptive verification is on
    adaptive = policy

    def new_scheduler(blocks: list[int], p) -> Scheduler:  # serves nobody: no progress line
        return make_scheduler(cfg, model, blocks, p, log_progress=False)

    return lambda mesh: startup_costs(cfg, adaptive, mesh, new_scheduler)


def load_tokenizer(model_dir: str) -> Tokenizer:
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise SystemExit(f"error: argument --model: {model_dir} has no tokenizer.json")
    return Tokenizer.from_file(path)


def log_starting(cfg: ServerConfig) -> None:
    log.info(
        "starting %d rank(s): dp=%d tp=%d ep=%d backend=%s dtype=%s model=%s (event loop: %s)",
        cfg.world_size,
        cfg.dp,
        cfg.tp,
        cfg.ep,
        cfg.backend,
        cfg.dtype,
        cfg.model,
        loop_name(asyncio.get_running_loop()),
    )


async def start_engine(
    cfg: ServerConfig, model: ModelConfig, tokenizer: Tokenizer, mesh: Mesh, observers: list[EngineObserver]
) -> EngineLoop:
    t0 = time.monotonic()
    log_starting(cfg)
    await mesh.start()
    for ob in observers:
        ob.set_num_blocks_total(mesh.num_blocks)
    engine = make_engine(cfg, model, mesh, tokenizer, observers)
    engine.start()
    log_ready(cfg, model, mesh, t0)
    return engine


def make_observers(cfg: ServerConfig) -> tuple[list[EngineObserver], Metrics]:
    """(observers, metrics): metrics always, the debug tap when --debug-tap is given."""
    metrics = Metrics(cfg.served_model_name, None, num_speculative_tokens=cfg.num_speculative_tokens)
    observers: list[EngineObserver] = [metrics]
    if cfg.debug_tap:
        observers.append(TapPublisher(cfg.debug_tap))
    return observers, metrics


async def run_server(cfg: ServerConfig, model: ModelConfig) -> int:
    from dspark_loop.api.app import GATE_KEY, create_app
    from dspark_loop.api.drain import Drain
    from dspark_loop.api.server import serve

    tokenizer = load_tokenizer(cfg.model)
    pending = PendingEngine(cfg.max_model_len)
    observers, metrics = make_observers(cfg)
    policy = verify_policy(cfg, model)
    metrics.verify.policy = policy  # its cost model and expected tokens in /metrics
    app = create_app(pending, tokenizer, cfg, model, metrics=metrics)
    supervisor = MeshSupervisor(
        lambda: make_mesh(cfg),
        lambda num_blocks: make_scheduler(cfg, model, num_blocks, policy),
        tokenizer,
        observers,
        RestartBudget(cfg.max_rank_restarts),
        async_scheduling=cfg.async_scheduling,
        stream_interval=cfg.stream_interval,
        prepare=startup_profile(cfg, model, policy) if profiles_at_startup(cfg) else None,
    )
    stop = asyncio.Event()
    started = asyncio.Event()
    drain = Drain(app[GATE_KEY], cfg.shutdown_timeout_s, stop)

    async def stop_engine() -> None:  # before the HTTP server closes: streams end cleanly
        await supervisor.close()

    server = asyncio.create_task(
        serve(
            app, cfg.host, cfg.port, stop=stop, started=started, before_cleanup=stop_engine, on_signal=drain.on_signal
        )
    )
    code = 0
    try:
        await asyncio.wait([server, asyncio.ensure_future(started.wait())], return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # raises the bind error
        t0 = time.monotonic()
        log_starting(cfg)
        # NOTE: a task, so a signal during start-up (ranks loading, node 0 waiting for other
        # nodes) stops the server now instead of after the load or --dist-timeout.
        starting = asyncio.create_task(supervisor.start())
        await asyncio.wait([starting, server], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
        try:
            pending.inner = await starting
            # NOTE: what start-up built (tokenizer, app, config) lives as long as the process:
            # the collector's full passes need not scan it again
            gc.collect()
            gc.freeze()
            log_ready(cfg, model, supervisor.mesh, t0)
        except MeshStartError as e:
            pending.start_error = f"ranks failed to start: {e}"
            log.error("%s", pending.start_error)
            stop.set()
            code = 1
        except asyncio.CancelledError:
            if not stop.is_set():
                raise
            log.info("start-up interrupted")
        await server
    finally:
        await supervisor.close()
        for ob in observers:
            ob.close()
        log.info("stopped")
    return code


def log_ready(cfg: ServerConfig, model: ModelConfig, mesh: Mesh, t0: float) -> None:
    log.info(
        "ready in %.1fs: %s pages per partition (families %s), max_model_len=%d, K=%d",
        time.monotonic() - t0,
        mesh.num_blocks,
        [f.name for f in CacheLayout.for_model(model, cfg.block_size).families],
        cfg.max_model_len,
        cfg.num_speculative_tokens,
    )


async def run_offline_mode(cfg: ServerConfig, model: ModelConfig) -> int:
    from dspark_loop.api.offline import run_offline

    tokenizer = load_tokenizer(cfg.model)
    mesh = make_mesh(cfg)
    try:
        engine = await start_engine(cfg, model, tokenizer, mesh, [])
        try:
            await run_offline(
                engine,
                tokenizer,
                list(cfg.prompts),
                cfg.max_tokens,
                bos_token_id=model.bos_token_id,
                stop=list(cfg.generate.stop),
                ignore_eos=cfg.generate.ignore_eos,
            )
        except (ValueError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            await engine.stop()
    except MeshStartError as e:
        print(f"error: ranks failed to start: {e}", file=sys.stderr)
        return 1
    finally:
        await mesh.close()
    return 0
