"""PromptEncoder: request prompts -> token ids, and ids -> text.

String prompts are tokenised without special tokens and get BOS prepended (the tokenizer
never adds it); token-id prompts are taken as given, each id checked against the vocab.
"""
from __future__ import annotations

from dspark_loop.api.errors import ApiError, bad_request

BOS_TEXT = "<｜begin▁of▁sentence｜>"


def _is_id(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class PromptEncoder:
    def __init__(self, tokenizer, bos_token_id: int | None, vocab_size: int):
        self.tokenizer = tokenizer
        if bos_token_id is None:
            bos_token_id = tokenizer.token_to_id(BOS_TEXT)
        self.bos_token_id = bos_token_id
        self.vocab_size = vocab_size

    def encode_text(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id, *ids] if add_bos and self.bos_token_id is not None else list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def check_ids(self, ids: list, param: str) -> list[int]:
        for i, t in enumerate(ids):
            if not _is_id(t):
                raise bad_request(f"`{param}` must be a list of integer token ids; item {i} is "
                                  f"{t!r}.", param, "invalid_type")
            if not 0 <= t < self.vocab_size:
                raise bad_request(f"Token id {t} at position {i} of `{param}` is out of "
                                  f"vocabulary (valid ids are 0..{self.vocab_size - 1}).", param)
        return list(ids)

    def completion_prompt(self, prompt) -> tuple[list[int], str | None]:
        """(prompt ids, prompt text if given as text) for /v1/completions' `prompt`."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if prompt is None:
            raise ApiError(400, "Missing required parameter `prompt`.", param="prompt",
                           code="missing_required_parameter")
        if isinstance(prompt, str):
            if not prompt:
                raise bad_request("The prompt is empty.", "prompt")
            return self.encode_text(prompt), prompt
        if isinstance(prompt, list):
            if not prompt:
                raise bad_request("The prompt is empty.", "prompt")
            if all(isinstance(p, (str, list)) for p in prompt):
                raise ApiError(400, f"Batched prompts are not supported ({len(prompt)} prompts "
                                    f"given); send one prompt per request.", param="prompt",
                               code="unsupported_parameter")
            return self.check_ids(prompt, "prompt"), None
        raise bad_request(f"`prompt` must be a string or a list of token ids, got "
                          f"{type(prompt).__name__}.", "prompt", "invalid_type")
