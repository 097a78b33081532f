"""The operator's flags (API keys, overload, drain, stalled streams, stream pacing, rank
restarts), kept apart from the model and topology flags in cli.py.

    add_ops_flags(parser)        the flags below
    ops_fields(parser, ns, env)  -> ServerConfig fields; a bad value exits 2 naming its flag

API keys come from every --api-key plus DSPARK_API_KEY (comma-separated). A key is never
echoed: not in an error message, not in the config's repr (a command line is visible to
every local user in /proc, so the environment variable is the better place for a key).
"""

from __future__ import annotations

import argparse
import re

from dspark_loop.config.flag_types import non_negative_int, positive_int, seconds
from dspark_loop.config.server_config import ServerConfig
from dspark_loop.mesh.restart_budget import RESTART_WINDOW_S

API_KEY_ENV = "DSPARK_API_KEY"
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what an HTTP header can carry


def add_ops_flags(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize "
        f"(repeatable; also {API_KEY_ENV}=KEY[,KEY...], which keeps keys off the "
        f"command line); /health, /metrics and /openapi.json stay open",
    )
    a(
        "--protect-router-info",
        action="store_true",
        help="with API keys, require the key on the routes a router polls too (/version, "
        "/server_info, /model_info, /loads and their aliases); by default they stay open",
    )
    a(
        "--max-queued-requests",
        # NOTE: every request waits a moment before its first step; 0 would refuse all
        type=positive_int,
        default=None,
        metavar="N",
        help="answer 503 with Retry-After at once when N requests already wait for a slot (default: no limit)",
    )
    a(
        "--shutdown-timeout",
        type=seconds,
        default=ServerConfig.shutdown_timeout_s,
        metavar="S",
        help="on SIGTERM (or a first SIGINT) stop admitting and let running requests finish "
        "for up to S seconds; the rest then end with an error (a second SIGINT stops at "
        "once)",
    )
    a(
        "--stream-write-timeout",
        type=seconds,
        default=ServerConfig.stream_write_timeout_s,
        metavar="S",
        help="abort a stream whose client has not taken a chunk for S seconds "
        "(its write buffer is full), freeing the request's pages; 0: never",
    )
    a(
        "--stream-interval",
        type=positive_int,
        default=ServerConfig.stream_interval,
        metavar="N",
        help="send a stream's client a chunk every N tokens (the first at once, the last at the end) "
        "instead of one per step: the host's work per stream falls by about N at high concurrency; "
        "the text and tokens a client receives are the same (as vLLM's --stream-interval; default 1)",
    )
    a(
        "--max-rank-restarts",
        type=non_negative_int,
        default=ServerConfig.max_rank_restarts,
        metavar="N",
        help=f"when a rank dies or hangs, fail the running requests, keep the "
        f"waiting ones and restart every rank, at most N times in any "
        f"{RESTART_WINDOW_S:g} s (then stay down, 503); 0: never restart",
    )


def api_keys(parser: argparse.ArgumentParser, flag_keys: list[str], env: dict) -> tuple[str, ...]:
    keys = list(flag_keys)
    from_env = env.get(API_KEY_ENV)
    if from_env is not None:
        keys += [k.strip() for k in from_env.split(",") if k.strip()]
        if not keys:
            parser.error(f"{API_KEY_ENV} is set but holds no key")
    for i, key in enumerate(keys):
        if not _KEY_CHARS.fullmatch(key):
            # NOTE: never echo the value: it is (nearly) a secret.
            where = f"key {i + 1}" if i < len(flag_keys) else API_KEY_ENV
            parser.error(
                f"argument --api-key: {where} must be non-empty visible ASCII with no spaces (value not shown)"
            )
    return tuple(dict.fromkeys(keys))


def ops_fields(parser: argparse.ArgumentParser, ns: argparse.Namespace, env: dict) -> dict:
    return {
        "api_keys": api_keys(parser, ns.api_key, env),
        "protect_router_info": ns.protect_router_info,
        "max_queued_requests": ns.max_queued_requests,
        "shutdown_timeout_s": ns.shutdown_timeout,
        "stream_write_timeout_s": ns.stream_write_timeout,
        "stream_interval": ns.stream_interval,
        "max_rank_restarts": ns.max_rank_restarts,
    }
