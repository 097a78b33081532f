"""Gumbel-max without the noise that cannot win: the same tokens and bits as the full row."""

import numpy as np
import pytest
import torch

from workers.comm import LocalComm
from workers.sampling.gumbel_max import BUCKET_SHIFT, _bucket_bounds, _fmix32_np, _row_keys_np, _vocab_np, perturbed
from workers.sampling.noise import gumbel_from_bits, gumbel_noise, row_keys, uniform_bits

NEG = float("-inf")


def _rows(L: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(-(1 << 62), 1 << 62, (L,), generator=g, dtype=torch.int64)
    c = torch.randint(0, 4, (L,), generator=g, dtype=torch.int64)
    p = torch.randint(0, 1 << 20, (L,), generator=g, dtype=torch.int64)
    return s, c, p


def test_the_numpy_words_equal_the_torch_noise_words():
    """The CPU path's uint32 hash (wrapping multiply) must give noise.uniform_bits' words."""
    s, c, p = _rows(64)
    want = uniform_bits(row_keys(s, c, p), torch.arange(100, 612))  # [64, 512]
    keys = _row_keys_np(s.numpy(), c.numpy(), p.numpy())
    got = _fmix32_np(keys[:, None] ^ _vocab_np(100, 512)[None, :])
    assert np.array_equal(got.astype(np.int64), want.numpy())


def test_the_bucket_bounds_bracket_every_words_noise():
    """lo[b] <= G(h) <= hi[b] (b = h >> BUCKET_SHIFT) for any word, the buckets' edges included."""
    lo, hi = _bucket_bounds()
    g = torch.Generator().manual_seed(1)
    h = torch.randint(0, 1 << 32, (200_000,), generator=g, dtype=torch.int64)
    edges = torch.arange(1 << (32 - BUCKET_SHIFT), dtype=torch.int64) << BUCKET_SHIFT
    h = torch.cat([h, edges, edges - 1, edges + 1, torch.tensor([(1 << 32) - 1])]).clamp(0, (1 << 32) - 1)
    G, b = gumbel_from_bits(h).numpy(), (h >> BUCKET_SHIFT).numpy()
    assert (lo[b] <= G).all() and (G <= hi[b]).all()


@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])
def test_the_pruned_row_has_the_full_rows_argmax_and_bits(scale):
    """Over rows of any spread, with filtered (-inf) entries and a wholly filtered row,
    perturbed() must keep the full x + G wherever it keeps a value, bit for bit, and its
    argmax (lowest id on ties) must be the full row's."""
    L, n = 48, 1024
    g = torch.Generator().manual_seed(int(scale * 10))
    x = torch.randn(L, n, generator=g) * scale
    x[1, : n - 3] = NEG  # a top-k of 3
    x[2] = NEG  # a TP slice with nothing inside the filters
    x[3, 7] = x[3].max() + 40  # one entry far ahead
    s, c, p = _rows(L, 2)
    full = x + gumbel_noise(s, c, p, 0, n)
    y = perturbed(x, s, c, p, 0)
    kept = y > NEG
    assert torch.equal(y[kept], full[kept])
    comm = LocalComm()
    assert torch.equal(comm.argmax_tp(y, 0), comm.argmax_tp(full, 0))
    assert int(kept.sum()) <= 8 * L  # a few entries per row, not the vocabulary


def test_a_vocab_slice_keeps_the_full_rows_values():
    """A TP rank's slice must keep the full row's x + G values (its own global ids' noise)."""
    L, n = 16, 512
    x = torch.randn(L, n, generator=torch.Generator().manual_seed(3)) * 4
    s, c, p = _rows(L, 4)
    for off, m in [(0, 256), (256, 256), (100, 50)]:
        part = x[:, off : off + m].contiguous()
        y = perturbed(part, s, c, p, off)
        full = part + gumbel_noise(s, c, p, off, m)
        kept = y > NEG
        assert torch.equal(y[kept], full[kept])
        assert torch.equal(y.argmax(-1), full.argmax(-1))
