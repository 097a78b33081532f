"""A byte-level BPE tokenizer for random checkpoints, trained locally (no downloads).

Special tokens keep DeepSeek-V4's exact strings (ASCII < > around U+FF5C, U+2581 inside);
their ids are fixed here: bos 0, eos 1 (also pad), then the chat markers and the DSpark
noise token at 7. If the trainer runs out of merges before `vocab_size`, the rest is
filled with unused `<｜place▁holder▁no▁N｜>` tokens, as DeepSeek's own vocab is.
Encoding never adds BOS (no post-processor): prompts are tokenised with
add_special_tokens=False and /v1/completions prepends BOS itself.
"""

from __future__ import annotations

import functools
import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dspark_loop.checkpoint.corpus import corpus_lines

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
NOISE = "<｜place▁holder▁no▁799｜>"
SPECIAL_TOKENS = [BOS, EOS, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", NOISE]
MIN_MERGE_COUNT = 2


@functools.lru_cache(maxsize=4)
def tokenizer_json(vocab_size: int) -> str:
    """tokenizer.json text with exactly `vocab_size` ids (cached: training is the slow part)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} cannot hold 256 bytes + the special tokens")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_MERGE_COUNT,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    filler = (f"<｜place▁holder▁no▁{i}｜>" for i in range(10**6) if i != 799)
    while tok.get_vocab_size(with_added_tokens=True) < vocab_size:
        missing = vocab_size - tok.get_vocab_size(with_added_tokens=True)
        tok.add_special_tokens([next(filler) for _ in range(missing)])
    for i, text in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(text) != i:
            raise RuntimeError(f"special token {text!r} got id {tok.token_to_id(text)}, want {i}")
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError("tokenizer vocab does not match vocab_size")
    return tok.to_str(pretty=True)


def tokenizer_config(max_len: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "additional_special_tokens": SPECIAL_TOKENS[2:],
    }


def write_tokenizer(out_dir: str, vocab_size: int, max_len: int) -> None:
    with open(f"{out_dir}/tokenizer.json", "w", encoding="utf-8") as f:
        f.write(tokenizer_json(vocab_size))
    with open(f"{out_dir}/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(max_len), f, indent=2, ensure_ascii=False)
        f.write("\n")
