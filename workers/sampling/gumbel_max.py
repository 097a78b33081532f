"""Gumbel-max without the noise of tokens that cannot win: x + G where it may be a row's
maximum, -inf elsewhere, bit for bit the entries of x + gumbel_noise(...) that matter.

Sampling takes argmax(x + G) per row (sampler.py); the noise G costs two logarithms per
vocab entry, which made a sampled row ~10x a greedy one on CPU (a K=7 step samples up to
15 rows per request: 8 verify rows and 7 drafts). Most entries cannot be the maximum:

    hash     h = the noise's 32-bit words, every entry (integer ops only, cheap)
    bound    B = G(max_v h_v) + MARGIN per row: no entry's noise is larger (G rises with h)
    thr      the exact score x_t + G_t of the row's top-logit entry t: the max is >= thr
    keep     entries with fl(x_v + B) >= thr; every other v has x_v + G_v < thr, so it is
             neither the maximum nor tied with it
    exact    x_v + G_v for the kept entries only, with noise.gumbel_from_bits: the very
             function and bits the full row computes

The result's argmax (and Comm.argmax_tp's lowest-id tie rule) is that of the full row.
A row whose top entry is -inf (all of it filtered, e.g. a TP slice outside top-k) stays
-inf, as the full row would be. On CPU the hash runs in numpy uint32, whose multiply wraps
mod 2^32 by definition: the same words as noise.fmix32's 16-bit-split int64 form, several
times cheaper; on other devices the torch form is used.
"""

from __future__ import annotations

import numpy as np
import torch

from workers.sampling.noise import GOLDEN, gumbel_from_bits, gumbel_noise, vocab_hash

BUCKET_SHIFT = 20  # the noise's words in 4096 buckets by their top 12 bits
MARGIN = 1e-3  # slack on the buckets' bounds: G's float evaluation need not rise strictly with h
_C1, _C2, _GOLDEN = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35), np.uint32(GOLDEN)
_vocab_words: dict[tuple[int, int], np.ndarray] = {}  # (offset, n) -> [n] uint32
_bounds: tuple[np.ndarray, np.ndarray] | None = None  # _bucket_bounds(), made once


def _fmix32_np(h: np.ndarray) -> np.ndarray:
    """noise.fmix32 on uint32 arrays, in place (unsigned multiply wraps mod 2^32)."""
    h ^= h >> 16
    h *= _C1
    h ^= h >> 13
    h *= _C2
    h ^= h >> 16
    return h


def _row_keys_np(seed: np.ndarray, choice: np.ndarray, position: np.ndarray) -> np.ndarray:
    """noise.row_keys on int64 arrays -> [L] uint32."""
    words = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, choice & 0xFFFFFFFF, position & 0xFFFFFFFF)
    k = np.zeros(len(seed), np.uint32)
    for w in words:
        k = _fmix32_np((k + _GOLDEN) ^ w.astype(np.uint32))
    return k


def _vocab_np(offset: int, n: int) -> np.ndarray:
    """noise.vocab_hash of ids offset .. offset+n-1 as [n] uint32 (made once)."""
    got = _vocab_words.get((offset, n))
    if got is None:
        got = vocab_hash(torch.arange(offset, offset + n, dtype=torch.int64)).numpy().astype(np.uint32)
        _vocab_words[(offset, n)] = got
    return got


def _bucket_bounds() -> tuple[np.ndarray, np.ndarray]:
    """[BUCKETS] fp32 each: the least and the greatest noise of the hash words h with
    h >> BUCKET_SHIFT == b (G rises with h), widened by MARGIN."""
    global _bounds
    if _bounds is None:
        b = torch.arange(1 << (32 - BUCKET_SHIFT), dtype=torch.int64)
        lo = gumbel_from_bits(b << BUCKET_SHIFT) - MARGIN
        hi = gumbel_from_bits(((b + 1) << BUCKET_SHIFT) - 1) + MARGIN
        _bounds = (lo.numpy(), hi.numpy())
    return _bounds


def perturbed(
    x: torch.Tensor, seed: torch.Tensor, choice: torch.Tensor, position: torch.Tensor, vocab_offset: int
) -> torch.Tensor:
    """x [L, n] fp32 (filtered logits / T of global ids vocab_offset .. +n-1), seed/choice/
    position [L] int64 -> [L, n] fp32: x + G where an entry may be its row's maximum, -inf
    elsewhere (see the module docstring). Off CPU: x + G everywhere."""
    L, n = x.shape
    if x.device.type != "cpu":
        return x + gumbel_noise(seed, choice, position, vocab_offset, n)
    y = torch.full_like(x, float("-inf"))
    if not L or not n:
        return y
    keys = _row_keys_np(seed.numpy(), choice.numpy(), position.numpy())  # [L]
    h = _fmix32_np(keys[:, None] ^ _vocab_np(vocab_offset, n)[None, :])  # [L, n] the noise's words
    lo, hi = _bucket_bounds()
    bucket = h >> BUCKET_SHIFT  # [L, n]
    xn = x.contiguous().numpy()  # [L, n]
    thr = (xn + lo.take(bucket)).max(-1)  # [L] a score the row's maximum reaches
    # NOTE: thr -inf: the whole row is -inf (filtered), and so is every entry of x + G
    keep = np.flatnonzero((xn + hi.take(bucket) >= thr[:, None]) & (thr > -np.inf)[:, None])  # [m] flat indices
    words = torch.from_numpy(h.reshape(-1)[keep].astype(np.int64))  # [m]
    idx = torch.from_numpy(keep)
    y.view(-1)[idx] = x.contiguous().view(-1)[idx] + gumbel_from_bits(words)
    return y
