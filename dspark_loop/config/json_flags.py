"""The flags whose value is a JSON object (--speculative-config, --generate-config,
--default-chat-template-kwargs): each parsed into its config value, every bad key or value
named (argparse prints it after the flag's name). The plain value types: flag_types.py.
"""

from __future__ import annotations

import argparse

from dspark_loop.config.flag_types import json_object
from dspark_loop.config.server_config import GENERATE_KEYS, THINKING_KEYS, GenerateDefaults, SpeculativeConfig


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
