"""The sampling fields of a request: vLLM's names, defaults and ranges, or a 400 naming the field.

    field                 default (when absent)          accepted
    temperature           generation default, else 1.0   >= 0 (below 1e-5: greedy)
    top_p                 generation default, else 1.0   (0, 1]
    top_k                 generation default, else off   -1 or 0 (off), >= 1
    min_p                 generation default, else 0     [0, 1]
    presence_penalty      0                              [-2, 2]
    frequency_penalty     0                              [-2, 2]
    repetition_penalty    generation default, else 1     > 0
    seed                  drawn by the server            [-2^63, 2^64)
    n                     1                              1 .. MAX_N
    best_of               n                              == n (more candidates than returned: 400)
    logprobs              none                           0 .. MAX_LOGPROBS (completions: int;
                                                         chat: bool + top_logprobs)

A request that leaves temperature out samples at the generation default (vLLM: the
checkpoint's generation_config.json, then --generate-config), else at 1.0 as OpenAI and vLLM.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from dspark_loop.api.errors import bad_request, unsupported

MAX_N = 128
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
SEED_RANGE = (-(1 << 63), 1 << 64)
NO_LOGPROBS = -1


@dataclass(frozen=True)
class SamplingDefaults:
    """Defaults for fields a request leaves out (generation_config.json, then --generate-config)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class SamplingFields:
    temperature: float
    top_p: float
    top_k: int  # 0 = off
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    seed: int  # always set: drawn when the request has none
    n: int
    num_logprobs: int  # NO_LOGPROBS, or how many top entries besides the sampled token


def _number(req, name: str, default: float) -> float:
    value = getattr(req, name, None)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"`{name}` must be a finite number, got {value!r}.", name, "invalid_type")
    return float(value)


def _in_range(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> None:
    if value < lo or value > hi or (lo_open and value == lo):
        left = "(" if lo_open else "["
        raise bad_request(f"`{name}` must be in {left}{lo:g}, {hi:g}], got {value:g}.", name)


def _num_logprobs(req, chat: bool) -> int:
    if not chat:
        value = getattr(req, "logprobs", None)
        if value is None:
            return NO_LOGPROBS
        if not 0 <= value <= MAX_LOGPROBS:
            raise bad_request(f"`logprobs` must be in [0, {MAX_LOGPROBS}], got {value}.", "logprobs")
        return value
    wanted, top = getattr(req, "logprobs", None), getattr(req, "top_logprobs", None)
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise bad_request(f"`top_logprobs` must be in [0, {MAX_LOGPROBS}], got {top}.", "top_logprobs")
    if top is not None and top > 0 and not wanted:
        raise bad_request("`top_logprobs` needs `logprobs: true`.", "top_logprobs")
    return (top or 0) if wanted else NO_LOGPROBS


def sampling_fields(req, defaults: SamplingDefaults, chat: bool = False) -> SamplingFields:
    """Checked sampling fields of a completions or chat request (any object with vLLM's names)."""
    temperature = _number(req, "temperature", defaults.temperature)
    if temperature < 0:
        raise bad_request(f"`temperature` must be >= 0, got {temperature:g}.", "temperature")
    top_p = _number(req, "top_p", defaults.top_p)
    _in_range("top_p", top_p, 0.0, 1.0, lo_open=True)
    top_k = getattr(req, "top_k", None)
    top_k = defaults.top_k if top_k is None else top_k
    if top_k < -1:
        raise bad_request(f"`top_k` must be -1 or 0 (off) or at least 1, got {top_k}.", "top_k")
    min_p = _number(req, "min_p", defaults.min_p)
    _in_range("min_p", min_p, 0.0, 1.0)
    presence = _number(req, "presence_penalty", 0.0)
    _in_range("presence_penalty", presence, -2.0, 2.0)
    frequency = _number(req, "frequency_penalty", 0.0)
    _in_range("frequency_penalty", frequency, -2.0, 2.0)
    repetition = _number(req, "repetition_penalty", defaults.repetition_penalty)
    if repetition <= 0:
        raise bad_request(f"`repetition_penalty` must be > 0, got {repetition:g}.", "repetition_penalty")
    seed = getattr(req, "seed", None)
    seed = defaults.seed if seed is None else seed
    if seed is not None and not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise bad_request(f"`seed` must be a 64-bit integer, got {seed}.", "seed")
    if seed is None:
        seed = secrets.randbits(63)  # NOTE: drawn here, so the ranks' noise stays a pure function
    if seed >= 1 << 63:
        seed -= 1 << 64  # the same 64 bits as a signed value (the ranks hold it in int64)
    n = getattr(req, "n", None)
    n = 1 if n is None else n
    if not 1 <= n <= MAX_N:
        raise bad_request(f"`n` must be in [1, {MAX_N}], got {n}.", "n")
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != n:
        if best_of < 1:
            raise bad_request(f"`best_of` must be at least 1, got {best_of}.", "best_of")
        raise unsupported(
            "best_of",
            f"best_of {best_of} is not supported (it would rank {best_of} "
            f"candidates and return {n}); send best_of equal to n or omit it.",
        )
    return SamplingFields(
        temperature,
        top_p,
        max(top_k, 0),
        min_p,
        presence,
        frequency,
        repetition,
        int(seed),
        n,
        _num_logprobs(req, chat),
    )
