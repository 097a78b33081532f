"""The synthetic target: the next token is a pure hash of (this token, its position) and,
for a sampled request, its (seed, choice); never of the batch, the tile, K or the topology.

    next(tok, pos)             greedy:  ordinary[mix(tok, pos) % n], or EOS
    next(tok, pos, seed, ch)   sampled: the same with the request's seed mixed in

So a decode row, a verify row and a prompt's last row at the same (token, position) all
predict the same token: K=7 == K=0, 1 rank == 16, any batch, preemption (a re-prefill ends
on the same token) and prefix hits (only the chunk's last token is read) included.
`ordinary` are the tokenizer's non-special ids (a synthetic text never emits a chat marker);
a profile's eos_rate is each position's chance of EOS.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SALT_TARGET = np.uint64(0x5D1A7E7A26E7C0DE)
SALT_SAMPLE = np.uint64(0x3C6EF372FE94F82B)
UNIT = 1.0 / (1 << 53)
MUL_TOKEN = np.uint64(0xD6E8FEB86659FD93)  # odd multipliers: distinct (token, position) pairs mix apart
MUL_POS = np.uint64(0xA0761D6478BD642F)
MIX_1, MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
SHIFT_30, SHIFT_27, SHIFT_31, SHIFT_11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic: arrays never warn)."""
    return mix64_inplace(np.array(x, np.uint64))


def mix64_inplace(x: np.ndarray) -> np.ndarray:
    """mix64 of a uint64 array this caller owns, written over it (fewer temporaries: the
    drafter's chain runs it on every anchor 14 times a step)."""
    x ^= x >> SHIFT_30
    x *= MIX_1
    x ^= x >> SHIFT_27
    x *= MIX_2
    x ^= x >> SHIFT_31
    return x


def hash_of(*parts) -> np.ndarray:
    """One uint64 per element of the broadcast parts (each an int array or scalar)."""
    arrays = [np.atleast_1d(np.asarray(p)) for p in parts]
    h = np.zeros(np.broadcast_shapes(*(a.shape for a in arrays)), np.uint64)
    for a in arrays:
        h = mix64(h * GOLDEN + a.astype(np.int64).astype(np.uint64))
    return h


def unit(h: np.ndarray) -> np.ndarray:
    """uint64 hashes -> float64 uniforms in [0, 1)."""
    return (h >> SHIFT_11).astype(np.float64) * UNIT


MODEL_KEY = re.compile(rb'"model"\s*:\s*(?=\{\s*"type")')  # the tokenizer's model object
ADDED_ID = re.compile(rb'"id"\s*:\s*(\d+)')


def ordinary_ids(model_dir: str, vocab_size: int, eos_ids: tuple[int, ...]) -> np.ndarray:
    """int64 [n]: ids below vocab_size in the tokenizer model's own vocabulary that are not
    added/special tokens (all ids below vocab_size without a tokenizer.json).

    NOTE: reads only the model object (at the end) and the head of added_tokens (sorted by
    id) instead of parsing the whole file: a Flash-size tokenizer.json is ~27 MB of added
    placeholder tokens, and 16 ranks parsing it would take seconds to start."""
    path = os.path.join(model_dir, "tokenizer.json")
    special = set(eos_ids)
    keep = np.zeros(vocab_size, bool)
    if not os.path.exists(path):
        keep[:] = True
    else:
        with open(path, "rb") as f:
            data = f.read()
        starts = [m.end() for m in MODEL_KEY.finditer(data)]
        vocab = None
        if starts:
            model, _ = json.JSONDecoder().raw_decode(data[starts[-1] :].decode("utf-8"))
            vocab = model.get("vocab")
        if isinstance(vocab, dict):
            ids = np.fromiter((i for i in vocab.values() if 0 <= i < vocab_size), np.int64)
            keep[ids] = True
            top = int(ids.max(initial=-1))
            for m in ADDED_ID.finditer(data):  # added_tokens come first, sorted by id
                if int(m.group(1)) > top:
                    break
                special.add(int(m.group(1)))
        else:  # another model type: parse it all
            doc = json.loads(data)
            keep[:] = True
            special |= {int(t["id"]) for t in doc.get("added_tokens", [])}
    keep[[i for i in special if 0 <= i < vocab_size]] = False
    ids = np.flatnonzero(keep)
    if not len(ids):
        raise ValueError(f"{path}: every id below vocab_size {vocab_size} is a special token")
    return ids


class SyntheticTarget:
    def __init__(self, ordinary: np.ndarray, eos_id: int, eos_rate: float) -> None:
        self.ordinary, self.eos_id, self.eos_rate = ordinary, eos_id, eos_rate

    def key(self, seed, choice, sampled) -> np.ndarray:
        """Per row: 0 for greedy, else a hash of the request's (seed, choice)."""
        k = hash_of(SALT_SAMPLE, seed, choice)
        return np.where(np.asarray(sampled, bool), k, np.uint64(0))

    def next(self, tokens, positions, key=0) -> np.ndarray:
        """int32 [n]: the target's token after `tokens` [n] at `positions` [n]."""
        tok = np.atleast_1d(np.asarray(tokens)).astype(np.uint64)
        pos = np.atleast_1d(np.asarray(positions)).astype(np.uint64)
        return self.after(self.base(key, pos), tok)

    @staticmethod
    def base(key, pos: np.ndarray) -> np.ndarray:
        """uint64, pos's shape: the part of next()'s hash input a chain knows before its
        tokens (the request's key and the position)."""
        return (np.asarray(key, np.uint64) ^ SALT_TARGET) + pos * MUL_POS

    def after(self, base: np.ndarray, tok: np.ndarray) -> np.ndarray:
        """int32 [n]: next() from base(key, pos) [n] and the tokens [n] (uint64)."""
        # NOTE: one linear combination, two mixing rounds (not hash_of's one per part): the
        # drafter calls this 7 times a step for every anchor
        h = mix64_inplace(mix64_inplace(base + tok * MUL_TOKEN))
        ordinary = self.ordinary
        out = ordinary.take(h % np.uint64(len(ordinary)))
        if self.eos_rate > 0:
            out[unit(mix64(h)) < self.eos_rate] = self.eos_id
        return out.astype(np.int32)

    def chain(self, token, position: int, n: int, key=0) -> np.ndarray:
        """int32 [n]: the target's own continuation after `token` at `position`."""
        out = np.empty(n, np.int32)
        tok = np.asarray([token])
        for i in range(n):
            tok = self.next(tok, np.asarray([position + i]), key)
            out[i] = tok[0]
        return out
