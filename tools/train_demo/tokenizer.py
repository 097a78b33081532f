"""Stage 1: a byte-level BPE over the train files, with DeepSeek-V4's special tokens at
their fixed ids (dspark_loop.checkpoint.tokenizer: bos 0, eos 1, noise 7), then the token streams.

    DIR/tokenizer/tokenizer.json, tokenizer_config.json
    DIR/tokenizer/train.npy, heldout.npy    uint16 streams: BOS file-tokens EOS, file after file
    DIR/tokenizer/corpus.json               corpus hash, file counts, token counts
"""

from __future__ import annotations

import json
import os

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dspark_loop.checkpoint.tokenizer import SPECIAL_TOKENS, tokenizer_config
from tools.train_demo.corpus import corpus_hash, split, stdlib_files

BOS_ID, EOS_ID = 0, 1


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, text in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(text) != i:
            raise RuntimeError(f"special token {text!r} got id {tok.token_to_id(text)}, want {i}")
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"the corpus gave {tok.get_vocab_size(with_added_tokens=True)} tokens, want {vocab_size}")
    return tok


def stream(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """BOS tokens EOS per text, concatenated: uint16 [n]."""
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        out += [BOS_ID, *enc.ids, EOS_ID]
    return np.asarray(out, np.uint16)


def corpus(smoke: bool):
    """(every corpus file, the train files, the held-out files); --smoke: the first 40 and 4."""
    files = stdlib_files()
    train, held = split(files)
    return (files, train[:40], held[:4]) if smoke else (files, train, held)


def run(out_dir: str, vocab_size: int, smoke: bool, log) -> dict:
    d = os.path.join(out_dir, "tokenizer")
    os.makedirs(d, exist_ok=True)
    files, train, held = corpus(smoke)
    tok = train_tokenizer([f.text for f in train], vocab_size)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=True)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(65536), f, indent=2, ensure_ascii=False)
        f.write("\n")
    tr, ho = stream(tok, [f.text for f in train]), stream(tok, [f.text for f in held])
    np.save(os.path.join(d, "train.npy"), tr)
    np.save(os.path.join(d, "heldout.npy"), ho)
    info = {
        "corpus_hash": corpus_hash(files),
        "num_files": len(files),
        "train_files": len(train),
        "heldout_files": len(held),
        "train_tokens": len(tr),
        "heldout_tokens": len(ho),
        "heldout_paths": [f.relpath for f in held],
        "vocab_size": vocab_size,
        "smoke": smoke,
        "bytes_per_token": round(sum(len(f.text.encode()) for f in train) / len(tr), 3),
    }
    with open(os.path.join(d, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    log(
        f"tokenizer: vocab {vocab_size}, train {len(tr)} tokens ({len(train)} files), held-out {len(ho)} "
        f"tokens ({len(held)} files), {info['bytes_per_token']} bytes/token, corpus {info['corpus_hash'][:16]}"
    )
    return info
