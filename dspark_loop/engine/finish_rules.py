"""Finish rules: where a request's accepted tokens end it -- EOS, stop ids, max_tokens,
the context end (truncate_at_finish) and stop strings on the detokenised text
(check_finish) -- which may cut an accepted list short. The acceptance chain itself is
dspark_loop/contract/acceptance.py (the ranks share it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark_loop.engine.detokenize import Detokenizer
from dspark_loop.engine.outputs import SamplingParams


@dataclass(frozen=True)
class FinishRules:
    eos_token_ids: tuple[int, ...]
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    max_tokens: int = 1 << 62
    max_model_len: int = 1 << 62
    # token ids that may end the request (EOS unless ignored, stop ids)
    finish_ids: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        eos = frozenset() if self.ignore_eos else frozenset(self.eos_token_ids)
        object.__setattr__(self, "finish_ids", frozenset(self.stop_token_ids) | eos)


@dataclass(slots=True)
class Finish:
    """What a request keeps of the tokens a step gave it, and whether they end it."""

    kept: list[int]
    text: str  # the text delta of `kept` (with the detokenizer's tail when finishing)
    reason: str | None  # "stop" | "length" | None (still running)
    stop_reason: str | int | None  # the stop string or token id that matched


def truncate_at_finish(
    tokens, num_output: int, num_prompt: int, rules: FinishRules
) -> tuple[list[int], str | None, int | None]:
    """Cut an accepted list at the first token that finishes the request.

    tokens: the accepted tokens in order; num_output: outputs before them.
    Returns (kept tokens, finish_reason or None, stop_reason token id or None). The
    finishing token is kept (EOS and stop ids count as generated tokens).
    """
    kept: list[int] = []
    for t in tokens:
        t = int(t)
        kept.append(t)
        n = num_output + len(kept)
        if n >= rules.min_tokens:
            if not rules.ignore_eos and t in rules.eos_token_ids:
                return kept, "stop", None
            if t in rules.stop_token_ids:
                return kept, "stop", t
        if n >= rules.max_tokens or num_prompt + n >= rules.max_model_len:
            return kept, "length", None
    return kept, None, None


def check_finish(
    accepted: list[int],
    num_output: int,
    num_prompt: int,
    rules: FinishRules,
    params: SamplingParams,
    detok: Detokenizer | None,
) -> Finish:
    """The finish rules, then stop strings, over the tokens a step accepted for a request
    with num_output outputs so far. Feeds its detokenizer (the request's text state)."""
    n_after = num_output + len(accepted)
    stop_reason: str | int | None  # a stop token id here, or a stop string below
    # NOTE: the common case (nothing can finish) skips the per-token rule walk.
    if (
        n_after < rules.max_tokens
        and num_prompt + n_after < rules.max_model_len
        and rules.finish_ids.isdisjoint(accepted)
    ):
        kept, reason, stop_reason = accepted, None, None
    else:
        kept, reason, stop_reason = truncate_at_finish(accepted, num_output, num_prompt, rules)
    if detok is None:
        return Finish(kept, "", reason, stop_reason)
    if detok.plain:  # no stop strings: the whole list's text at once
        text = detok.feed(kept[:-1] if reason == "stop" and not params.include_stop_str_in_output else kept)
        return Finish(kept, text if reason is None else text + detok.finish(), reason, stop_reason)
    base = num_output + 1 - params.min_tokens  # >= 0: stop strings apply
    last = len(kept) - 1 if reason == "stop" and not params.include_stop_str_in_output else -1
    for j, t in enumerate(kept):
        if j == last:
            break  # the EOS / stop id itself contributes no text
        if detok.add(t, base + j >= 0) is not None:
            del kept[j + 1 :]
            reason, stop_reason = "stop", detok.stop_matched
            break
    text = detok.take_delta() if reason is None else detok.take_delta() + detok.finish()
    return Finish(kept, text, reason, stop_reason)
