"""What the API hands the engine (GenerateRequest) and what the engine streams back
(RequestOutput). The API layer never sees scheduler state; the engine never sees HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.contract.sampling_knobs import SamplingKnobs


class TokenConstraint(Protocol):
    """A logit constraint (api/structured/grammar_constraint.GrammarConstraint), asked once per
    step for the masks of the request's sampled rows (engine/token_masks.py)."""

    def row_masks(self, output_ids: list[int], drafts: list[int], /) -> list[bytes]:
        """Packed masks for rows 0..m (m <= len(drafts)): row i is what may follow output_ids
        + drafts[:i]; the list ends after the first draft it refuses. It may replace drafts
        in place (a token the grammar forces). Raises when output_ids broke it. A constraint
        may also say, as `forced_rows` (list[int]), which rows of that walk allowed one token
        only (their drafts are then accepted whenever the rows before them were)."""
        ...


@dataclass
class SamplingParams:
    max_tokens: int  # already capped to the context by the API/engine
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)  # stop strings, matched on detokenised text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    seed: int | None = None  # the noise's seed (the API draws one when the client sent none)
    skip_special_tokens: bool = True  # False: special tokens appear in text
    # special tokens spelled in the text even when skipped: chat's parser markers (</think>, ｜DSML｜)
    keep_special: tuple[str, ...] = ()
    knobs: SamplingKnobs = field(default_factory=SamplingKnobs)  # the default: greedy
    choice: int = 0  # n > 1: this choice's index (same seed, its own noise)
    logprobs: int = -1  # -1: none; N >= 0: each new token's logprob + the top N
    prompt_logprobs: int = -1  # the same for the prompt's tokens (echo + logprobs)
    max_draft_tokens: int = DSPARK_K  # K=7: at most this many drafts verified per step (0: off)

    @property
    def needs_sampling_spec(self) -> bool:
        """Anything beyond plain greedy: the ranks must be told (protocol.SamplingSpec)."""
        k = self.knobs
        return k.is_random or k.has_penalty or self.logprobs >= 0 or self.prompt_logprobs >= 0


@dataclass
class TokenLogprob:
    """One position's logprob: the token there, log p (None: a prompt's first token), and
    the top entries (id, log p), best first."""

    token_id: int
    logprob: float | None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # Parser for chat/tool output may need the raw token ids; text is always produced.
    arrival_time: float = 0.0
    # Optional logit constraint (response_format, tool_choice required/named; api/structured/);
    # None = free. Asked once per step for the request's sampled rows (engine/token_masks.py).
    constraint: TokenConstraint | None = None


class RequestOutput(msgspec.Struct):
    """One delivery to a request's channel: a delta since the previous one. (A Struct:
    built in C, ~3x cheaper than a dataclass; the engine builds 256 of them per step.)"""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # set with finish_reason "error"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # total so far
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    stop_reason: str | int | None = None  # the stop string or token id that matched
    logprobs: list[TokenLogprob] | None = None  # per new token (params.logprobs >= 0)
    prompt_logprobs: list[TokenLogprob] | None = None  # the whole prompt, on the first delta
    speculation: tuple[int, int, int] | None = None  # on the finishing delta: (proposed, accepted, verify steps)


def error_output(
    request_id: str, message: str, num_prompt_tokens: int = 0, num_output_tokens: int = 0
) -> RequestOutput:
    return RequestOutput(
        request_id,
        [],
        "",
        finished=True,
        finish_reason="error",
        error=message,
        num_prompt_tokens=num_prompt_tokens,
        num_output_tokens=num_output_tokens,
    )
