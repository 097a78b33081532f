"""Logprobs in OpenAI's two response shapes.

    /v1/completions   {"tokens": [str], "token_logprobs": [float | null],
                       "top_logprobs": [{str: float} | null], "text_offset": [int]}
                      (echo: the prompt's tokens first; its first token has null entries;
                      top_logprobs: the `logprobs` likeliest and the sampled token, as OpenAI)
    /v1/chat          {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
                       "logprob", "bytes"}]}]}

A token's string is its own decoding (as vLLM's decoded_token). -inf (an id a constraint
refused) is written as -9999.0, as vLLM does: JSON has no infinity.
"""

from __future__ import annotations

import math

from dspark_loop.engine.outputs import TokenLogprob

FLOOR = -9999.0


def _lp(x: float) -> float:
    return FLOOR if math.isinf(x) or math.isnan(x) or x < FLOOR else float(x)


class LogprobsFormatter:
    def __init__(self, token_text) -> None:
        self.token_text = token_text  # id -> str

    def completion(
        self, entries: list[TokenLogprob], text_offset: int = 0, in_text: list[bool] | None = None
    ) -> tuple[dict, int]:
        """entries: one per token; text_offset: where the first one starts in the answer's text;
        in_text: per entry, whether the answer's text spells it (not the BOS prepended to a text
        prompt, nor a special token the text skips: such an entry starts where the next does).
        Returns (the dict, where the next entry starts)."""
        tokens: list[str] = []
        lps: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for i, e in enumerate(entries):
            offsets.append(text_offset)
            text = self.token_text(e.token_id)
            tokens.append(text)
            text_offset += len(text) if in_text is None or in_text[i] else 0
            if e.logprob is None:
                lps.append(None)
                tops.append(None)
                continue
            lps.append(_lp(e.logprob))
            top: dict[str, float] = {}
            for tid, lp in e.top:
                top.setdefault(self.token_text(tid), _lp(lp))
            top.setdefault(text, _lp(e.logprob))  # the sampled token's too (OpenAI: up to logprobs + 1 entries)
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, text_offset

    def chat(self, entries: list[TokenLogprob]) -> dict:
        def one(tid: int, lp: float) -> dict:
            text = self.token_text(tid)
            return {"token": text, "logprob": _lp(lp), "bytes": list(text.encode("utf-8"))}

        def entry(e: TokenLogprob) -> dict:
            assert e.logprob is not None  # generated tokens always have one (a prompt's first has not)
            return {**one(e.token_id, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}

        return {"content": [entry(e) for e in entries]}
