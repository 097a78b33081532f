"""Acceptance on the host: the linear chain itself (accept_chain, explained in
dspark_loop/acceptance.py, where the ranks share it) plus the scheduler's finish
truncation -- EOS, stop ids, max_tokens, context -- which may cut an accepted list short
(truncate_at_finish() below)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_loop.acceptance import accept_chain  # noqa: F401 -- re-exported


@dataclass(frozen=True)
class FinishRules:
    eos_token_ids: tuple[int, ...]
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    max_tokens: int = 1 << 62
    max_model_len: int = 1 << 62


def truncate_at_finish(tokens, num_output: int, num_prompt: int, rules: FinishRules
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
