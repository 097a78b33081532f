"""Linear-chain acceptance (greedy DSpark verify; the function lives in
dspark_loop/acceptance.py so the ranks share it) and finish truncation.

A verify step feeds 8 rows per request: row 0 the last committed token, rows 1..7 the
drafts d[0..6]. The target predicts p[i] = argmax after row i. Row i+1 was the right
input iff d[i] == p[i], so the chain holds while drafts equal predictions; with m the
length of that matching prefix, the target itself produced p[0..m] -- m matched drafts
plus the target's own token at the first mismatch (or the bonus after 7 matches).
That is 1..8 tokens, exactly what greedy K=0 decoding would emit over m+1 steps, so
speculation changes speed, never tokens. The scheduler may still cut the list short
(EOS, stop ids, max_tokens, context) -- truncate_at_finish() below.
"""
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
