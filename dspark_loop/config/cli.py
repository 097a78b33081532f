"""The command line: flags -> ServerConfig, with every bad value named by its flag.

parse_args(argv)   flags only (types, ranges, JSON shapes) -> a filled ServerConfig
load_config(argv)  + the checkpoint: resolves --model (or the embedded default), reads
                   config.json and applies config.validate; bad input exits 2 with
                   argparse's "error:" line naming the flag.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import replace

from dspark_loop.config.cli_ops import add_ops_flags, ops_fields
from dspark_loop.config.server_config import (
    DEFAULT_RING_HEAP,
    GENERATE_KEYS,
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
from dspark_loop.mesh.nodes import parse_host_port
from dspark_loop.observe.tap_publisher import tap_address

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tib": 2**40,
}


# ---- value types (each raises ArgumentTypeError; argparse prefixes the flag) ------------------
def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return value


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535 (got {text!r})")
    return value


def device_list(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise argparse.ArgumentTypeError(f"must be comma-separated non-negative device ids like 0,1,2,3 (got {text!r})")
    ids = tuple(int(p) for p in parts)
    if len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"lists a device twice (got {text!r})")
    return ids


def byte_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in SIZE_UNITS or float(m.group(1)) * SIZE_UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive size in bytes, or with a unit like 512MiB or 2GiB (got {text!r})"
        )
    return int(float(m.group(1)) * SIZE_UNITS[unit])


def ring_heap(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (1, 4) or not all(re.fullmatch(r"\d+", p) and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"must be one positive integer or four comma-separated positive integers, one per "
            f"scope depth (got {text!r})"
        )
    sizes = tuple(int(p) for p in parts)
    return sizes * 4 if len(sizes) == 1 else sizes


def _json_object(text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"is not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object (got {text!r})")
    return obj


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def speculative_config(text: str) -> SpeculativeConfig:
    obj = _json_object(text)
    unknown = sorted(set(obj) - {"method", "num_speculative_tokens"})
    if unknown:
        raise argparse.ArgumentTypeError(f"has unknown keys {unknown}; known: method, num_speculative_tokens")
    method = obj.get("method", "dspark")
    if method != "dspark":
        raise argparse.ArgumentTypeError(f'method must be "dspark" (got {method!r})')
    k = obj.get("num_speculative_tokens", 0)
    if not _is_int(k) or k < 0:
        raise argparse.ArgumentTypeError(f"num_speculative_tokens must be a non-negative integer (got {k!r})")
    return SpeculativeConfig(method, k)


def generate_config(text: str) -> GenerateDefaults:
    obj = _json_object(text)
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


def non_negative_int(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise argparse.ArgumentTypeError(f"must be a non-negative integer (got {text!r})")
    return int(text)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds (got {text!r})")
    return value


def host_port(text: str) -> str:
    try:
        parse_host_port(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def debug_tap(text: str) -> str:
    try:
        return tap_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
    a("--backend", choices=["cpu", "npu", "cuda"], default="cpu")
    a("--platform", default=None, help="accelerator platform, e.g. a2a3 (informational on cpu)")
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
        default=False,
        help="plan step N+1 while the ranks run step N (pipeline depth 2; K=0 only, K=7 "
        "stays in lockstep); off by default",
    )
    a(
        "--speculative-config",
        type=speculative_config,
        default=SpeculativeConfig(),
        metavar="JSON",
        help='{"method":"dspark","num_speculative_tokens":0|7}',
    )
    a(
        "--ring-heap",
        type=ring_heap,
        default=DEFAULT_RING_HEAP,
        metavar="BYTES",
        help="runtime ring heap per scope depth: one int or four comma-separated ints "
        "(NPU sizing; validated but unused on cpu)",
    )
    a(
        "--generate-config",
        type=generate_config,
        default=GenerateDefaults(),
        metavar="JSON",
        help=f"server defaults for requests: {', '.join(GENERATE_KEYS)}",
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
        ring_heap=ns.ring_heap,
        generate=ns.generate_config,
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
    )
    return fill_defaults(cfg)


def load_config(argv: list[str] | None = None) -> tuple[ServerConfig, ModelConfig]:
    """Flags + checkpoint, validated; exits 2 with every problem named by its flag."""
    parser = build_parser()
    cfg = parse_args(argv)
    if cfg.model is None:
        from dspark_loop.config.default_model import default_model_dir

        cfg = replace(cfg, model=default_model_dir())
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
