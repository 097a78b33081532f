"""The command line: flags -> ServerConfig, with every bad value named by its flag.

parse_args(argv)   flags only (types, ranges, JSON shapes) -> a filled ServerConfig
load_config(argv)  + the checkpoint: resolves --model (or the embedded default), reads
                   config.json and applies config.validate; bad input exits 2 with
                   argparse's "error:" line naming the flag.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from dspark_loop.config.cli_ops import add_ops_flags, ops_fields
from dspark_loop.config.cli_sim import add_sim_flags, sim_fields
from dspark_loop.config.flag_types import (
    byte_size,
    debug_tap,
    device_list,
    host_port,
    json_object,
    non_negative_int,
    port_number,
    positive_int,
    positive_seconds,
)
from dspark_loop.config.server_config import (
    GENERATE_KEYS,
    THINKING_KEYS,
    ConfigError,
    GenerateDefaults,
    ServerConfig,
    SpeculativeConfig,
    fill_defaults,
    validate,
)
from dspark_loop.contract.mesh_auth import SecretError, resolve_secret
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.event_loop import EVENT_LOOPS, loop_factory

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


# ---- JSON flags (the plain value types are in flag_types.py) -----------------------------
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "enable_adaptive_verification", "cost_model")


def speculative_config(text: str) -> SpeculativeConfig:
    obj = json_object(text)
    unknown = sorted(set(obj) - set(SPECULATIVE_KEYS))
    if unknown:
        raise argparse.ArgumentTypeError(f"has unknown keys {unknown}; known: {', '.join(SPECULATIVE_KEYS)}")
    method = obj.get("method", "dspark")
    if method != "dspark":
        raise argparse.ArgumentTypeError(f'method must be "dspark" (got {method!r})')
    k = obj.get("num_speculative_tokens", 0)
    if not _is_int(k) or k < 0:
        raise argparse.ArgumentTypeError(f"num_speculative_tokens must be a non-negative integer (got {k!r})")
    adaptive = obj.get("enable_adaptive_verification")
    if adaptive is not None and not isinstance(adaptive, bool):
        raise argparse.ArgumentTypeError(f"enable_adaptive_verification must be true or false (got {adaptive!r})")
    cost_model = obj.get("cost_model")
    if cost_model is not None and (not isinstance(cost_model, str) or not cost_model):
        raise argparse.ArgumentTypeError(f"cost_model must be a JSON file's path (got {cost_model!r})")
    return SpeculativeConfig(method, k, adaptive, cost_model)


def chat_template_kwargs(text: str) -> dict:
    obj = json_object(text)
    unknown = sorted(set(obj) - set(THINKING_KEYS))
    if unknown:
        raise argparse.ArgumentTypeError(f"has unknown keys {unknown}; known: {', '.join(THINKING_KEYS)}")
    for key, value in obj.items():
        if not isinstance(value, bool):
            raise argparse.ArgumentTypeError(f"{key} must be true or false (got {value!r})")
    return obj


def generate_config(text: str) -> GenerateDefaults:
    obj = json_object(text)
    unknown = sorted(set(obj) - set(GENERATE_KEYS))
    if unknown:
        raise argparse.ArgumentTypeError(f"has unknown keys {unknown}; known: {', '.join(GENERATE_KEYS)}")
    checks = {
        "max_new_tokens": (lambda v: _is_int(v) and v > 0, "a positive integer"),
        "temperature": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
        "top_p": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
        "top_k": (lambda v: _is_int(v) and v >= -1, "an integer >= -1 (-1 or 0: off)"),
        "min_p": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
        "repetition_penalty": (lambda v: _is_number(v) and v > 0, "a number > 0"),
        "seed": (_is_int, "an integer"),
        "stop": (
            lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
            "a string or a list of strings",
        ),
        "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    }
    for key, value in obj.items():
        ok, what = checks[key]
        if value is not None and not ok(value):
            raise argparse.ArgumentTypeError(f"{key} must be {what} (got {value!r})")
    stop = obj.get("stop") or ()
    if any(s == "" for s in ([stop] if isinstance(stop, str) else stop)):
        raise argparse.ArgumentTypeError("stop strings must not be empty")
    return GenerateDefaults(
        max_new_tokens=obj.get("max_new_tokens"),
        temperature=obj.get("temperature"),
        top_p=obj.get("top_p"),
        top_k=obj.get("top_k"),
        min_p=obj.get("min_p"),
        repetition_penalty=obj.get("repetition_penalty"),
        seed=obj.get("seed"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        ignore_eos=bool(obj.get("ignore_eos") or False),
    )


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
        default=None,
        metavar="DIR",
        help="checkpoint directory (config.json, tokenizer.json, *.safetensors); default: the "
        "embedded tiny random checkpoint on 1 CPU rank, built once into the cache directory",
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
    a("--devices", type=device_list, default=None, metavar="CSV", help="device ids, one per rank (default 0..ep-1)")
    a("--dp", type=positive_int, default=None, help="TP groups (cache partitions)")
    a("--tp", type=positive_int, default=None, help="ranks per TP group")
    a("--ep", type=positive_int, default=None, help="ranks in all (= devices = dp*tp)")
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
        'step cost model learned online, or pinned from FILE ({"c0":s,"c_row":s,"c_req":s,"c_draft":s,'
        '"c_ctx":s}) for reproducible runs',
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
    a(
        "--nnodes",
        type=positive_int,
        default=1,
        help="hosts in the run; each runs --ep/--nnodes ranks (docs/deployment.md)",
    )
    a(
        "--node-rank",
        type=non_negative_int,
        default=0,
        help="this host: 0 serves HTTP and runs the engine, the others only their ranks",
    )
    a(
        "--dist-init-addr",
        type=host_port,
        default=None,
        metavar="HOST:PORT",
        help="node 0's address, the same on every node: torch.distributed's rendezvous at PORT, "
        "the rank mesh at PORT+1 (required with --nnodes > 1; the nodes share the secret in "
        "DSPARK_MESH_SECRET)",
    )
    a(
        "--dist-timeout",
        type=positive_seconds,
        default=600.0,
        metavar="SECONDS",
        help="how long node 0 waits for every rank's Hello and the other nodes for node 0; "
        "torch.distributed's timeout (default 600)",
    )
    add_ops_flags(p)
    add_sim_flags(p)
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
        generate=ns.generate_config,
        default_chat_template_kwargs=ns.default_chat_template_kwargs,
        prompts=tuple(ns.prompt),
        max_tokens=ns.max_tokens,
        log_level=ns.log_level,
        event_loop=ns.loop,
        kv_cache_memory=ns.kv_cache_memory,
        num_blocks=ns.num_blocks,
        debug_tap=ns.debug_tap,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        dist_timeout_s=ns.dist_timeout,
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
