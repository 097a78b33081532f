"""A request's generation fields -> SamplingParams, or a 400 naming the field.

Sampling fields: vLLM's names, defaults and ranges (sampling_ranges.py), defaults from the
checkpoint's generation_config.json under --generate-config (generation_defaults.py).
max_tokens defaults to --generate-config's max_new_tokens, else 16 (OpenAI's default; chat:
the context left), capped to the context left after the prompt. A max_tokens the request
names itself is never cut: beyond the context left it is a 400 with the lengths, in vLLM's
words.
"""

from __future__ import annotations

from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.errors import ApiError, bad_request, unsupported
from dspark_loop.api.generation.sampling_ranges import NO_LOGPROBS, SamplingDefaults, sampling_fields
from dspark_loop.api.prompt import PromptEncoder
from dspark_loop.api.schemas import CompletionRequest, GenerationFields
from dspark_loop.config.server_config import GenerateDefaults
from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.outputs import SamplingParams

DEFAULT_MAX_TOKENS = 16


def check_completion_options(req: CompletionRequest) -> None:
    """The fields only /v1/completions has (chat checks its own in chat_completions)."""
    if req.suffix:
        raise unsupported("suffix", "suffix (insertion) is not supported by this server.")


def check_unsupported(req: GenerationFields) -> None:
    if req.logit_bias:
        raise unsupported("logit_bias", "logit_bias is not supported by this server.")


def requested_max_tokens(req: GenerationFields, defaults: GenerateDefaults, default: int) -> int:
    if (
        req.max_tokens is not None
        and req.max_completion_tokens is not None
        and req.max_tokens != req.max_completion_tokens
    ):
        raise bad_request(
            f"max_tokens ({req.max_tokens}) and max_completion_tokens "
            f"({req.max_completion_tokens}) disagree; send one of them.",
            "max_tokens",
        )
    param = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    value = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
    if value is None:
        return defaults.max_new_tokens or default
    if value < 1:
        raise bad_request(f"{param} must be at least 1, got {value}.", param)
    return value


def context_overflow(max_model_len: int, prompt_len: int, max_tokens: int, completion_tokens: bool) -> ApiError:
    return ApiError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the completion). "
        "Please reduce the length of the messages or completion.",
        param="max_completion_tokens" if completion_tokens else "max_tokens",
        code="context_length_exceeded",
    )


def stop_strings(req: GenerationFields, defaults: GenerateDefaults) -> list[str]:
    if req.stop is None:
        return list(defaults.stop)
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if any(s == "" for s in stops):
        raise bad_request("stop strings must not be empty.", "stop")
    return stops


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest,
    defaults: GenerateDefaults,
    encoder: PromptEncoder,
    prompt_len: int,
    max_model_len: int,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    sampling_defaults: SamplingDefaults | None = None,
) -> SamplingParams:
    """Validated params; the caller has already checked prompt_len < max_model_len.
    default_max_tokens: when the request and --generate-config name no length.
    sampling_defaults: generation_config.json + --generate-config (None: vLLM's own)."""
    check_unsupported(req)
    s = sampling_fields(req, sampling_defaults or SamplingDefaults())
    wanted = requested_max_tokens(req, defaults, default_max_tokens)
    if (req.max_tokens is not None or req.max_completion_tokens is not None) and prompt_len + wanted > max_model_len:
        raise context_overflow(max_model_len, prompt_len, wanted, req.max_completion_tokens is not None)
    max_tokens = min(wanted, max_model_len - prompt_len)
    min_tokens = req.min_tokens or 0
    if min_tokens < 0:
        raise bad_request(f"min_tokens must be >= 0, got {min_tokens}.", "min_tokens")
    if min_tokens > wanted:
        raise bad_request(f"min_tokens ({min_tokens}) must be at most max_tokens ({wanted}).", "min_tokens")
    stop_ids = encoder.check_ids(req.stop_token_ids or [], "stop_token_ids")
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(min_tokens, max_tokens),
        stop=stop_strings(req, defaults),
        stop_token_ids=stop_ids,
        ignore_eos=defaults.ignore_eos if req.ignore_eos is None else req.ignore_eos,
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        skip_special_tokens=req.skip_special_tokens is not False,
        seed=s.seed,
        knobs=s.knobs,
        logprobs=s.num_logprobs,
        prompt_logprobs=s.num_logprobs if isinstance(req, CompletionRequest) and req.echo else NO_LOGPROBS,
        max_draft_tokens=max_draft_tokens(req),
    )


def max_draft_tokens(req: GenerationFields) -> int:
    """`"speculation": {"max_draft_tokens": n}`: 0..DSPARK_K (0: no speculation)."""
    n = req.speculation.max_draft_tokens if req.speculation is not None else None
    if n is None:
        return DSPARK_K
    if not 0 <= n <= DSPARK_K:
        raise bad_request(
            f"speculation.max_draft_tokens must be in 0..{DSPARK_K} (0: no speculation), got {n}.",
            "speculation.max_draft_tokens",
        )
    return n
