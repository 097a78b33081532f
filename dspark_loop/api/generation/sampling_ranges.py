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
from dataclasses import dataclass, field

from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.errors import bad_request, unsupported
from dspark_loop.api.limits import MAX_LOGPROBS, MAX_N, SEED_RANGE
from dspark_loop.api.schemas import CompletionRequest
from dspark_loop.contract.sampling_knobs import SamplingKnobs

NO_LOGPROBS = -1
DEFAULT_TEMPERATURE = 1.0  # OpenAI's and vLLM's, when neither the request nor a default names one


@dataclass(frozen=True)
class SamplingDefaults:
    """Defaults for fields a request leaves out (generation_config.json, then --generate-config):
    the knobs (all but the penalties presence/frequency may come from there) and the seed."""

    knobs: SamplingKnobs = field(default_factory=lambda: SamplingKnobs(temperature=DEFAULT_TEMPERATURE))
    seed: int | None = None


@dataclass(frozen=True)
class SamplingFields:
    knobs: SamplingKnobs  # checked, defaults filled; top_k 0 = off
    seed: int  # always set: drawn when the request has none
    n: int
    num_logprobs: int  # NO_LOGPROBS, or how many top entries besides the sampled token


def _number(value: float | None, name: str, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"`{name}` must be a finite number, got {value!r}.", name, "invalid_type")
    return float(value)


def _in_range(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> None:
    if value < lo or value > hi or (lo_open and value == lo):
        left = "(" if lo_open else "["
        raise bad_request(f"`{name}` must be in {left}{lo:g}, {hi:g}], got {value:g}.", name)


def _num_logprobs(req: CompletionRequest | ChatCompletionRequest) -> int:
    if isinstance(req, CompletionRequest):
        value = req.logprobs
        if value is None:
            return NO_LOGPROBS
        if not 0 <= value <= MAX_LOGPROBS:
            raise bad_request(f"`logprobs` must be in [0, {MAX_LOGPROBS}], got {value}.", "logprobs")
        return value
    wanted, top = req.logprobs, req.top_logprobs
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise bad_request(f"`top_logprobs` must be in [0, {MAX_LOGPROBS}], got {top}.", "top_logprobs")
    if top is not None and top > 0 and not wanted:
        raise bad_request("`top_logprobs` needs `logprobs: true`.", "top_logprobs")
    return (top or 0) if wanted else NO_LOGPROBS


def _knobs(req: CompletionRequest | ChatCompletionRequest, defaults: SamplingKnobs) -> SamplingKnobs:
    temperature = _number(req.temperature, "temperature", defaults.temperature)
    if temperature < 0:
        raise bad_request(f"`temperature` must be >= 0, got {temperature:g}.", "temperature")
    top_p = _number(req.top_p, "top_p", defaults.top_p)
    _in_range("top_p", top_p, 0.0, 1.0, lo_open=True)
    top_k = defaults.top_k if req.top_k is None else req.top_k
    if top_k < -1:
        raise bad_request(f"`top_k` must be -1 or 0 (off) or at least 1, got {top_k}.", "top_k")
    min_p = _number(req.min_p, "min_p", defaults.min_p)
    _in_range("min_p", min_p, 0.0, 1.0)
    presence = _number(req.presence_penalty, "presence_penalty", 0.0)
    _in_range("presence_penalty", presence, -2.0, 2.0)
    frequency = _number(req.frequency_penalty, "frequency_penalty", 0.0)
    _in_range("frequency_penalty", frequency, -2.0, 2.0)
    repetition = _number(req.repetition_penalty, "repetition_penalty", defaults.repetition_penalty)
    if repetition <= 0:
        raise bad_request(f"`repetition_penalty` must be > 0, got {repetition:g}.", "repetition_penalty")
    return SamplingKnobs(
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        min_p=min_p,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
    )


def sampling_fields(req: CompletionRequest | ChatCompletionRequest, defaults: SamplingDefaults) -> SamplingFields:
    """Checked sampling fields of a completions or chat request."""
    knobs = _knobs(req, defaults.knobs)
    seed = defaults.seed if req.seed is None else req.seed
    if seed is not None and not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise bad_request(f"`seed` must be a 64-bit integer, got {seed}.", "seed")
    if seed is None:
        seed = secrets.randbits(63)  # NOTE: drawn here, so the ranks' noise stays a pure function
    if seed >= 1 << 63:
        seed -= 1 << 64  # the same 64 bits as a signed value (the ranks hold it in int64)
    n = 1 if req.n is None else req.n
    if not 1 <= n <= MAX_N:
        raise bad_request(f"`n` must be in [1, {MAX_N}], got {n}.", "n")
    best_of = req.best_of if isinstance(req, CompletionRequest) else None
    if best_of is not None and best_of != n:
        if best_of < 1:
            raise bad_request(f"`best_of` must be at least 1, got {best_of}.", "best_of")
        raise unsupported(
            "best_of",
            f"best_of {best_of} is not supported (it would rank {best_of} "
            f"candidates and return {n}); send best_of equal to n or omit it.",
        )
    return SamplingFields(knobs, int(seed), n, _num_logprobs(req))
