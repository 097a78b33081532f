"""The value types of the command line's flags: text -> value, or ArgumentTypeError.

argparse prefixes each error with "argument --flag:", so every message names its flag.
cli.py (model and topology) and cli_ops.py (the operator's flags) both take theirs here.
"""

from __future__ import annotations

import argparse
import json
import math
import re

from dspark_loop.mesh.nodes import parse_host_port
from dspark_loop.observe.tap_publisher import tap_address

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


# --platform: the seeds' runtime platforms, the hardware (a2a3: Atlas A2/A3; a5) and its
# simulator (*sim); a torch backend runs on whichever device torch sees, so it only reports it
PLATFORMS = ("a2a3", "a2a3sim", "a5", "a5sim")
RING_DEPTHS = 4  # --ring-heap: one size per scope depth of the seeds' runtime


def _digits(text: str) -> int | None:
    """The value of plain decimal digits (surrounding spaces allowed), else None: no sign,
    no underscores, no fraction."""
    return int(text) if re.fullmatch(r"\s*\d+\s*", text) else None


def positive_int(text: str) -> int:
    value = _digits(text)
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return value


def non_negative_int(text: str) -> int:
    value = _digits(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer (got {text!r})")
    return value


def port_number(text: str) -> int:
    value = _digits(text)
    if value is None or value > 65535:
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
    """One positive byte count for every scope depth, or RING_DEPTHS of them, one per depth."""
    sizes = [_digits(p) for p in text.split(",")]
    if len(sizes) not in (1, RING_DEPTHS) or not all(s is not None and s > 0 for s in sizes):
        raise argparse.ArgumentTypeError(
            f"must be one positive integer or {RING_DEPTHS} comma-separated positive integers, bytes per "
            f"scope depth (got {text!r})"
        )
    return tuple(s for s in sizes if s is not None) * (RING_DEPTHS if len(sizes) == 1 else 1)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def positive_seconds(text: str) -> float:
    if not _finite(text) > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds (got {text!r})")
    return float(text)


def fraction(text: str) -> float:
    """A share in (0, 1]."""
    if not 0 < _finite(text) <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1] (got {text!r})")
    return float(text)


def seconds(text: str) -> float:
    """A number of seconds >= 0 (0 usually means: never)."""
    if not _finite(text) >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0 (got {text!r})")
    return float(text)


def json_object(text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"is not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object (got {text!r})")
    return obj


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
