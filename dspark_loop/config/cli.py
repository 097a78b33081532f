"""The command line: flags -> ServerConfig, with every bad value named by its flag.

parse_args(argv)   flags only (types, ranges, JSON shapes) -> a filled ServerConfig
load_config(argv)  + the checkpoint: resolves --model (or the embedded default), reads
                   config.json and applies startup_rules.validate; bad input exits 2 with
                   argparse's "error:" line naming the flag.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from dspark_loop.config.cli_compat import ALIASES, add_compat_flags
from dspark_loop.config.cli_nodes import add_node_flags, node_fields
from dspark_loop.config.cli_ops import add_ops_flags, ops_fields
from dspark_loop.config.cli_sim import add_sim_flags, sim_fields
from dspark_loop.config.flag_types import (
    PLATFORMS,
    byte_size,
    debug_tap,
    device_list,
    fraction,
    port_number,
    positive_int,
    ring_heap,
)
from dspark_loop.config.json_flags import chat_template_kwargs, generate_config, speculative_config
from dspark_loop.config.server_config import (
    GENERATE_KEYS,
    GenerateDefaults,
    ServerConfig,
    SpeculativeConfig,
    fill_defaults,
)
from dspark_loop.config.startup_rules import ConfigError, validate
from dspark_loop.contract.mesh_auth import SecretError, resolve_secret
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DEFAULT_RING_HEAP
from dspark_loop.event_loop import EVENT_LOOPS, loop_factory

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


# ---- the parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dspark_loop",
        description="Serve DeepSeek-V4 with DSpark speculative decoding behind an "
        "OpenAI-compatible API (or generate offline with --prompt).",
    )
    a = p.add_argument
    a(
        "--model",
        *ALIASES["--model"],
        default=None,
        metavar="DIR",
        help="checkpoint directory (config.json, tokenizer.json, *.safetensors); default: the "
        "trained DSpark demo shipped in the package (dspark_loop/demo) on 1 CPU rank",
    )
    a("--served-model-name", default=None, help="the model id clients send (default: the checkpoint directory's name)")
    a("--host", default="127.0.0.1")
    a("--port", type=port_number, default=8000)
    a(
        "--backend",
        choices=["cpu", "npu", "cuda", "sim"],
        default="cpu",
        help="sim: the simulated device, no model, profiled step times (docs/simulated-device.md)",
    )
    a(
        "--platform",
        choices=PLATFORMS,
        default=None,
        help="the device platform (the seeds' names); reported in /server_info, the torch backends run on "
        "whatever device torch sees",
    )
    a("--devices", type=device_list, default=None, metavar="CSV", help="device ids, one per rank (default 0..ep-1)")
    a("--dp", *ALIASES["--dp"], type=positive_int, default=None, help="TP groups (cache partitions)")
    a("--tp", *ALIASES["--tp"], type=positive_int, default=None, help="ranks per TP group")
    a("--ep", *ALIASES["--ep"], type=positive_int, default=None, help="ranks in all (= devices = dp*tp)")
    a(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="activation dtype; auto = float32 on cpu, bfloat16 elsewhere",
    )
    a("--max-model-len", type=positive_int, default=1024)
    a("--block-size", type=positive_int, default=32)
    a("--max-num-seqs", type=positive_int, default=None, help="default 64 per TP group")
    a("--max-num-batched-tokens", type=positive_int, default=8192)
    a(
        "--long-prefill-token-threshold",
        type=positive_int,
        default=None,
        help="largest prefill chunk per request (default min(8192, --max-num-batched-tokens))",
    )
    a(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse cached KV pages of shared prompt prefixes (hits align to the LCM of the "
        "cache page sizes, 128 tokens for Flash; K=7 keeps the last 128 prompt tokens "
        "to replay); on by default",
    )
    a(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="plan step N+1 while the ranks run step N (pipeline depth 2: inputs the plan "
        "does not know yet are placeholders the ranks fill; K=0 and K=7); on by default",
    )
    a(
        "--speculative-config",
        type=speculative_config,
        default=SpeculativeConfig(),
        metavar="JSON",
        help='{"method":"dspark","num_speculative_tokens":0|7,"enable_adaptive_verification":true|false,'
        '"cost_model":"FILE"}: adaptive verification (on by default when the drafter has a confidence '
        "head) chooses each request's verify length and drafter skips from the drafts' confidences and a "
        "step cost table (per partition: requests x verify rows x drafter pass), profiled at start-up "
        "(--verify-profile) or read from FILE (a saved profile: a cache file of --verify-profile), and "
        "refined online",
    )
    a(
        "--verify-profile",
        choices=("auto", "off", "refresh"),
        default="auto",
        help="adaptive verification's start-up cost profile (no cost_model given): auto (the default) loads "
        "the table cached for this checkpoint, topology and backend, else times dummy decode steps through "
        "the ranks before serving (a few seconds) and caches them in $DSPARK_CACHE_DIR (default "
        "$XDG_CACHE_HOME/dspark_loop)/verify-profiles; refresh profiles again; off learns the costs online only",
    )
    a(
        "--ring-heap",
        type=ring_heap,
        default=DEFAULT_RING_HEAP,
        metavar="BYTES",
        help="the device runtime's ring heap per scope depth: one int or four comma-separated ints "
        "(default 2,2,4,8 GiB); handed to each rank's backend, which logs once when it does not use it",
    )
    a(
        "--weight-bank-size",
        type=positive_int,
        default=None,
        metavar="LAYERS",
        help="decoder layers whose weight banks stay resident (1..num_hidden_layers; default all); handed "
        "to each rank's backend like --ring-heap",
    )
    a(
        "--generate-config",
        type=generate_config,
        default=GenerateDefaults(),
        metavar="JSON",
        help=f"server defaults for requests: {', '.join(GENERATE_KEYS)}",
    )
    a(
        "--default-chat-template-kwargs",
        type=chat_template_kwargs,
        default=None,
        metavar="JSON",
        help='chat_template_kwargs a chat request gets unless it sets its own, e.g. {"thinking": false} '
        "(keys: thinking, enable_thinking); default {} (thinking on), except for the embedded demo, "
        'whose small model cannot reason: {"thinking": false}',
    )
    a(
        "--prompt",
        action="append",
        default=[],
        help="offline mode (repeatable): generate for this prompt, print it, exit; no server",
    )
    a("--max-tokens", type=positive_int, default=16, help="offline mode: tokens per prompt")
    a("--log-level", type=str.lower, choices=LOG_LEVELS, default="info")
    a(
        "--loop",
        choices=EVENT_LOOPS,
        default="auto",
        help="the server's event loop: auto = uvloop when installed (a dependency on Linux), else asyncio",
    )
    a(
        "--kv-cache-memory",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help="bytes per rank for KV pages, e.g. 512MiB (default 256MiB on cpu)",
    )
    a(
        "--gpu-memory-utilization",
        "--mem-fraction-static",
        type=fraction,
        default=ServerConfig.gpu_memory_utilization,
        metavar="F",
        help="accelerators without --kv-cache-memory: the share of each device's memory a rank may "
        "use; KV pages get what is left of it once the weights are loaded (default 0.9)",
    )
    a(
        "--num-blocks",
        type=positive_int,
        default=None,
        help="pages per cache family per partition (overrides --kv-cache-memory)",
    )
    a(
        "--debug-tap",
        type=debug_tap,
        default=None,
        metavar="ADDR",
        help="publish a StepTrace per engine step on this ZeroMQ PUB address (a bare port "
        "means loopback: 5599 = tcp://127.0.0.1:5599)",
    )
    add_node_flags(p)
    add_ops_flags(p)
    add_sim_flags(p)
    add_compat_flags(p)
    return p


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.model is not None and not os.path.isfile(os.path.join(ns.model, "config.json")):
        parser.error(f"argument --model: {ns.model!r} is not a checkpoint directory (no config.json)")
    if ns.served_model_name is not None and not ns.served_model_name.strip():
        parser.error("argument --served-model-name: must not be empty")
    try:
        loop_factory(ns.loop)
    except ValueError as e:
        parser.error(f"argument --loop: {e}")
    cfg = ServerConfig(
        model=ns.model,
        served_model_name=ns.served_model_name,
        host=ns.host,
        port=ns.port,
        backend=ns.backend,
        platform=ns.platform,
        devices=ns.devices,
        dp=ns.dp,
        tp=ns.tp,
        ep=ns.ep,
        dtype=ns.dtype,
        max_model_len=ns.max_model_len,
        block_size=ns.block_size,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        long_prefill_token_threshold=ns.long_prefill_token_threshold,
        enable_prefix_caching=ns.enable_prefix_caching,
        async_scheduling=ns.async_scheduling,
        speculative=ns.speculative_config,
        verify_profile=ns.verify_profile,
        ring_heap=ns.ring_heap,
        weight_bank_size=ns.weight_bank_size,
        generate=ns.generate_config,
        default_chat_template_kwargs=ns.default_chat_template_kwargs,
        prompts=tuple(ns.prompt),
        max_tokens=ns.max_tokens,
        log_level=ns.log_level,
        event_loop=ns.loop,
        kv_cache_memory=ns.kv_cache_memory,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        num_blocks=ns.num_blocks,
        debug_tap=ns.debug_tap,
        **node_fields(ns),
        **ops_fields(parser, ns, os.environ),
        **sim_fields(parser, ns),
    )
    return fill_defaults(cfg)


def load_config(argv: list[str] | None = None) -> tuple[ServerConfig, ModelConfig]:
    """Flags + checkpoint, validated; exits 2 with every problem named by its flag."""
    parser = build_parser()
    cfg = parse_args(argv)
    if cfg.model is None:
        from dspark_loop.config.default_model import default_model_dir

        cfg = replace(cfg, model=default_model_dir())
        if cfg.default_chat_template_kwargs is None:
            # NOTE: the embedded demo's small model never closes a thinking section: thinking
            # on, every chat answer (a json_schema one included) would stay in reasoning_content
            cfg = replace(cfg, default_chat_template_kwargs={"thinking": False})
    try:
        model = ModelConfig.from_dir(cfg.model)
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"argument --model: cannot read {cfg.model}/config.json: {e!r}")
    try:
        resolve_secret(cfg.nnodes)  # NOTE: only checked here; launch.py and node_agent.py use it
    except SecretError as e:
        parser.error(str(e))
    try:
        validate(cfg, model)
    except ConfigError as e:
        parser.error("invalid configuration:\n  " + "\n  ".join(e.problems))
    return cfg, model
