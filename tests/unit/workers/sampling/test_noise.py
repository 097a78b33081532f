"""The counter-based noise: a pure function of (seed, choice, position, vocab id)."""

import math

import torch

from workers.sampling.noise import (
    MASK32,
    _fmix32_,
    _mul32,
    fmix32,
    gumbel_from_bits,
    gumbel_noise,
    row_keys,
    uniform_bits,
)

# hash words of (seed 42, choice 0, position 7) for vocab ids 0..3
PINNED_WORDS = [2591823500, 242068222, 1612381136, 4150489117]


def _fmix32_py(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def _coords(n: int, seed=7, choice=0, position=11):
    t = lambda v: torch.full((n,), v, dtype=torch.int64)  # noqa: E731
    return t(seed), t(choice), t(position)


def test_split_multiply_and_fmix_equal_python_big_integer_arithmetic():
    """The overflow-free 32-bit multiply and fmix32 must equal exact big-integer arithmetic mod 2^32."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 1 << 32, (4000,), generator=g, dtype=torch.int64)
    x[:4] = torch.tensor([0, 1, MASK32, 1 << 31])
    assert _mul32(x, 0xC2B2AE35).tolist() == [(v * 0xC2B2AE35) & MASK32 for v in x.tolist()]
    assert fmix32(x).tolist() == [_fmix32_py(v) for v in x.tolist()]
    assert torch.equal(_fmix32_(x.clone(), torch.empty_like(x)), fmix32(x))  # the in-place path


def test_noise_is_pinned_for_a_known_coordinate():
    """The noise is part of the reproducibility contract (a seed must give the same tokens
    across releases and devices): these hash words must never change."""
    seed, choice, pos = (torch.tensor([v]) for v in (42, 0, 7))
    words = uniform_bits(row_keys(seed, choice, pos), torch.arange(4)).tolist()[0]
    assert words == PINNED_WORDS, words


def test_any_vocab_slice_gets_the_full_rows_values():
    """A TP rank's slice [off, off+n) must get exactly the full row's noise there."""
    s, c, p = _coords(3)
    full = gumbel_noise(s, c, p, 0, 96)  # [3, 96]
    for off, n in [(0, 48), (48, 48), (24, 24), (72, 24), (5, 1)]:
        assert torch.equal(gumbel_noise(s, c, p, off, n), full[:, off : off + n]), (off, n)


def test_a_rows_noise_does_not_depend_on_the_other_rows():
    """Row r's noise must be the same alone and among 300 rows with other coordinates."""
    g = torch.Generator().manual_seed(1)
    seed = torch.randint(-(1 << 62), 1 << 62, (300,), generator=g)
    choice = torch.randint(0, 4, (300,), generator=g)
    pos = torch.randint(0, 1 << 20, (300,), generator=g)
    full = gumbel_noise(seed, choice, pos, 0, 33)
    for r in (0, 17, 299):
        alone = gumbel_noise(seed[r : r + 1], choice[r : r + 1], pos[r : r + 1], 0, 33)
        assert torch.equal(alone, full[r : r + 1])


def test_chunked_noise_equals_the_whole_tensor_formula():
    """gumbel_noise works in row chunks; the result must equal the unchunked formula."""
    g = torch.Generator().manual_seed(2)
    seed, pos = torch.randint(0, 1 << 40, (3000,), generator=g), torch.randint(0, 9999, (3000,), generator=g)
    choice = torch.zeros(3000, dtype=torch.int64)
    whole = gumbel_from_bits(uniform_bits(row_keys(seed, choice, pos), torch.arange(40, 73)))
    assert torch.equal(gumbel_noise(seed, choice, pos, 40, 33), whole)


def test_every_coordinate_changes_the_noise():
    """Changing the seed (either half), the choice index or the position must give new noise."""
    base = gumbel_noise(*_coords(1), 0, 64)
    for s, c, p in [(8, 0, 11), (7 + (1 << 32), 0, 11), (7, 1, 11), (7, 0, 12)]:
        other = gumbel_noise(*_coords(1, s, c, p), 0, 64)
        assert (other != base).float().mean() > 0.9, (s, c, p)


def test_words_look_uniform_and_the_noise_looks_gumbel():
    """Over 1M words: each byte value ~uniform, uncorrelated with the neighbour id, seed or
    position, and the noise's mean/variance equal Gumbel(0,1)'s (0.5772, pi^2/6)."""
    s, c, p = _coords(1000)
    s = s + torch.arange(1000)
    h = uniform_bits(row_keys(s, c, p), torch.arange(1000))  # [1000, 1000]
    counts = torch.bincount((h & 0xFF).reshape(-1), minlength=256).double()
    chi2 = ((counts - counts.mean()) ** 2 / counts.mean()).sum()
    assert chi2 < 400, chi2  # df 255: mean 255, sd 22.6
    u = (h.double() + 0.5) / 2**32
    for a, b in [(u[:, :-1], u[:, 1:]), (u[:-1], u[1:])]:  # neighbour ids, neighbour seeds
        corr = torch.corrcoef(torch.stack([a.reshape(-1), b.reshape(-1)]))[0, 1]
        assert abs(corr) < 0.005, corr
    pos = uniform_bits(row_keys(s[:1].expand(1000), c, torch.arange(1000)), torch.arange(1000))
    u = (pos.double() + 0.5) / 2**32  # one seed, neighbour positions
    corr = torch.corrcoef(torch.stack([u[:-1].reshape(-1), u[1:].reshape(-1)]))[0, 1]
    assert abs(corr) < 0.005, corr
    g = gumbel_from_bits(h).double()
    assert abs(g.mean() - 0.5772156649) < 0.005
    assert abs(g.var() - math.pi**2 / 6) < 0.02


def test_extreme_words_give_finite_noise_at_both_tails():
    """Words 0 and 2^32-1 must give the finite extremes (~-3.13 and ~22.9), never inf/nan."""
    g = gumbel_from_bits(torch.tensor([0, 1 << 31, (1 << 31) - 1, MASK32]))
    assert torch.isfinite(g).all()
    assert -3.2 < g[0] < -3.1 and 22.8 < g[3] < 23.0
