"""The tests' tokenizer: the same byte-level BPE a random checkpoint ships (1024 ids, built
in memory, no downloads), so fake-engine, engine and served tests all read one vocabulary."""

from __future__ import annotations

import functools

from tokenizers import Tokenizer

from dspark_loop.checkpoint.tokenizer import BOS, EOS, tokenizer_json

VOCAB_SIZE = 1024


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> Tokenizer:
    return Tokenizer.from_str(tokenizer_json(VOCAB_SIZE))


def eos_id() -> int:
    return tiny_tokenizer().token_to_id(EOS)


def bos_id() -> int:
    return tiny_tokenizer().token_to_id(BOS)
