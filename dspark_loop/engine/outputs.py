"""What the API hands the engine (GenerateRequest) and what the engine streams back
(RequestOutput). The API layer never sees scheduler state; the engine never sees HTTP.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_tokens: int  # already capped to the context by the API/engine
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)  # stop strings, matched on detokenised text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    seed: int | None = None  # accepted for API compatibility; greedy ignores it
    skip_special_tokens: bool = True  # False: special tokens (</think>, ｜DSML｜) appear in text


@dataclass
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # Parser for chat/tool output may need the raw token ids; text is always produced.
    arrival_time: float = 0.0
    # Optional logit constraint (tool_choice required/named), see api/ tools; None = free.
    # Duck-typed: allowed_token_mask(output_ids) -> bool [vocab]; asked every step for the
    # request's one sampled row (a constrained request never speculates).
    constraint: object | None = None


@dataclass
class RequestOutput:
    """One delivery to a request's queue: a delta since the previous one."""
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
