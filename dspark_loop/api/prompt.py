"""PromptEncoder: request prompts -> token ids, and ids -> text.

String prompts are tokenised without special tokens and get BOS prepended (the tokenizer
never adds it); token-id prompts are taken as given, each id checked against the vocab.
"""

from __future__ import annotations

import numpy as np

from dspark_loop.api.errors import ApiError, bad_request, context_length_exceeded
from dspark_loop.engine.detokenize import special_token_ids

BOS_TEXT = "<｜begin▁of▁sentence｜>"
# Texts at least this long are tokenised with the GIL released (encode_batch): a long prompt is
# accepted in a worker thread (limits.BIG_BODY_BYTES), and `encode` holds the GIL throughout,
# so a 1 MB prompt stalled every other request's stream for ~0.6 s. Below it `encode` is cheaper.
GIL_FREE_CHARS = 16_384


def _is_id(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class PromptEncoder:
    def __init__(self, tokenizer, bos_token_id: int | None, vocab_size: int):
        self.tokenizer = tokenizer
        if bos_token_id is None:
            bos_token_id = tokenizer.token_to_id(BOS_TEXT)
        self.bos_token_id = bos_token_id
        self.vocab_size = vocab_size

    @property
    def special_ids(self) -> frozenset[int]:
        """The tokenizer's special tokens (an answer skipping them does not spell them)."""
        return special_token_ids(self.tokenizer)

    def encode_text(self, text: str, add_bos: bool = True) -> list[int]:
        if len(text) >= GIL_FREE_CHARS:
            ids = self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        else:
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id, *ids] if add_bos and self.bos_token_id is not None else list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def check_ids(self, ids: list, param: str) -> list[int]:
        # NOTE: C-level passes (map, fromiter, numpy), not a Python loop over a prompt of up to
        # max_model_len ids (the GIL, ~190 ms a million); the loop below names the first bad item
        if set(map(type, ids)) <= {int}:
            try:
                a = np.fromiter(ids, np.int64, len(ids))
            except OverflowError:
                a = None
            if a is not None and not ((a < 0) | (a >= self.vocab_size)).any():
                return list(ids)
        for i, t in enumerate(ids):
            if not _is_id(t):
                raise bad_request(
                    f"`{param}` must be a list of integer token ids; item {i} is {t!r}.", param, "invalid_type"
                )
            if not 0 <= t < self.vocab_size:
                raise bad_request(
                    f"Token id {t} at position {i} of `{param}` is out of "
                    f"vocabulary (valid ids are 0..{self.vocab_size - 1}).",
                    param,
                )
        return list(ids)

    def completion_prompts(self, prompt, max_len: int | None = None) -> list[tuple[list[int], str | None]]:
        """/v1/completions' `prompt` -> [(ids, text if given as text)]: one per prompt of a
        batch (a list of strings or of id lists), else one. An id list of max_len or more is
        refused before its ids are read (the context check, early)."""
        batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
        if batch and all(isinstance(p, (str, list)) for p in prompt):
            return [self._one_prompt(p, f"prompt[{i}]", max_len) for i, p in enumerate(prompt)]
        if isinstance(prompt, list) and not batch and max_len is not None and len(prompt) >= max_len:
            raise context_length_exceeded(len(prompt), max_len)
        if isinstance(prompt, list) and (batch or set(map(type, prompt)) & {str, list}):
            raise bad_request(
                "`prompt` mixes token ids with strings or lists; send a list of "
                "token ids, a list of strings or a list of token-id lists.",
                "prompt",
                "invalid_type",
            )
        return [self._one_prompt(prompt, "prompt", max_len)]

    def _one_prompt(self, prompt, where: str, max_len: int | None = None) -> tuple[list[int], str | None]:
        if prompt is None:
            raise ApiError(
                400, "Missing required parameter `prompt`.", param="prompt", code="missing_required_parameter"
            )
        if isinstance(prompt, str):
            if not prompt:
                raise bad_request(f"The prompt is empty ({where}).", "prompt")
            return self.encode_text(prompt), prompt
        if isinstance(prompt, list):
            if not prompt:
                raise bad_request(f"The prompt is empty ({where}).", "prompt")
            if max_len is not None and len(prompt) >= max_len:
                raise context_length_exceeded(len(prompt), max_len)
            return self.check_ids(prompt, "prompt"), None
        raise bad_request(
            f"`prompt` must be a string or a list of token ids, got {type(prompt).__name__}.", "prompt", "invalid_type"
        )
