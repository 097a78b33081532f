"""Gumbel-max sampling: the right distribution, greedy at T=0, the same token for a row
alone, in any batch and on any TP split."""

import pytest
import torch

from tests.unit.workers.sampling.sharded import run_sharded
from tests.unit.workers.sampling.test_processors import reference_filter
from workers.comm import LocalComm
from workers.sampling.processors import PenaltyRows
from workers.sampling.rows import SamplingRows
from workers.sampling.sampler import sample

ALPHA = 1e-3  # significance of the chi-square tests
TINY = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0])  # an 8-token vocabulary
NUM_SEEDS = 20_000


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square over the ids with p > 0; p-value = Q(df/2, chi2/2)."""
    kept = probs > 0
    expected = probs[kept] * counts.sum()
    chi2 = ((counts[kept] - expected) ** 2 / expected).sum()
    df = int(kept.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), chi2 / 2))


@pytest.mark.parametrize(
    "t,min_p,top_k,top_p",
    [
        (1.0, 0.0, 0, 1.0),
        (0.7, 0.0, 0, 1.0),
        (1.5, 0.0, 0, 1.0),
        (1.0, 0.0, 0, 0.8),
        (0.8, 0.0, 4, 1.0),
        (1.2, 0.0, 5, 0.9),
        (1.0, 0.1, 0, 1.0),
    ],
)
def test_first_tokens_over_many_seeds_follow_the_filtered_softmax(t, min_p, top_k, top_p):
    """Over 20,000 seeds the first sampled token's frequencies must match softmax of the
    reference-filtered logits (chi-square, alpha = 0.001), and filtered ids never appear."""
    logits = TINY.expand(NUM_SEEDS, -1).contiguous()
    rows = SamplingRows.make(
        NUM_SEEDS,
        temperature=t,
        min_p=min_p,
        top_k=top_k,
        top_p=top_p,
        seed=torch.arange(NUM_SEEDS) * 7919 + 1,
        position=12,
    )
    tokens = sample(logits, rows, LocalComm(), 0)
    counts = torch.bincount(tokens, minlength=len(TINY)).double()
    probs = torch.softmax(reference_filter(TINY, t, min_p, top_k, top_p).double(), dim=-1)
    assert (counts[probs == 0] == 0).all(), counts
    p = chi_square_p_value(counts, probs)
    assert p > ALPHA, (p, counts / NUM_SEEDS, probs)


def test_positions_of_one_seed_also_follow_the_softmax():
    """One seed over 20,000 positions (a long generation) must match the softmax too."""
    logits = TINY.expand(NUM_SEEDS, -1).contiguous()
    rows = SamplingRows.make(NUM_SEEDS, temperature=1.0, seed=123, position=torch.arange(NUM_SEEDS))
    counts = torch.bincount(sample(logits, rows, LocalComm(), 0), minlength=len(TINY)).double()
    assert chi_square_p_value(counts, torch.softmax(TINY.double(), -1)) > ALPHA


def test_a_biased_sampler_fails_the_same_check():
    """The check must be able to fail: frequencies of softmax at T=0.9 are rejected as T=1."""
    logits = TINY.expand(NUM_SEEDS, -1).contiguous()
    rows = SamplingRows.make(NUM_SEEDS, temperature=0.9, seed=torch.arange(NUM_SEEDS))
    counts = torch.bincount(sample(logits, rows, LocalComm(), 0), minlength=len(TINY)).double()
    assert chi_square_p_value(counts, torch.softmax(TINY.double(), -1)) < ALPHA


def test_different_seeds_and_choices_give_different_tokens_and_equal_ones_the_same():
    """Same (seed, choice, position) -> same token; other seeds or choice indices must differ
    somewhere over a 64-token vocabulary."""
    logits = torch.zeros(200, 64)  # uniform: every token equally likely
    a = sample(logits, SamplingRows.make(200, temperature=1.0, seed=5, position=torch.arange(200)), LocalComm(), 0)
    b = sample(logits, SamplingRows.make(200, temperature=1.0, seed=5, position=torch.arange(200)), LocalComm(), 0)
    c = sample(logits, SamplingRows.make(200, temperature=1.0, seed=6, position=torch.arange(200)), LocalComm(), 0)
    d = sample(
        logits, SamplingRows.make(200, temperature=1.0, seed=5, choice=1, position=torch.arange(200)), LocalComm(), 0
    )
    assert torch.equal(a, b)
    assert (a != c).float().mean() > 0.9 and (a != d).float().mean() > 0.9


def mixed_rows(n: int) -> SamplingRows:
    g = torch.Generator().manual_seed(9)
    t = torch.rand(n, generator=g) * 1.5
    t[::4] = 0.0  # every 4th row greedy
    return SamplingRows.make(
        n,
        temperature=t,
        top_k=torch.randint(0, 30, (n,), generator=g),
        top_p=torch.where(torch.rand(n, generator=g) < 0.5, torch.ones(n), torch.rand(n, generator=g)),
        min_p=torch.where(torch.rand(n, generator=g) < 0.7, torch.zeros(n), torch.rand(n, generator=g) * 0.2),
        seed=torch.randint(-(1 << 40), 1 << 40, (n,), generator=g),
        choice=torch.randint(0, 3, (n,), generator=g),
        position=torch.randint(0, 5000, (n,), generator=g),
    )


def test_greedy_rows_are_plain_argmax_beside_random_rows():
    """T=0 rows must give the lowest-id argmax of their logits whatever the other rows do."""
    logits = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)).round()  # many ties
    rows = mixed_rows(64)
    tokens = sample(logits, rows, LocalComm(), 0)
    greedy = ~rows.is_random
    first_max = (logits == logits.amax(-1, keepdim=True)).float().argmax(-1)
    assert torch.equal(tokens[greedy], first_max[greedy])


def test_a_row_samples_the_same_token_alone_and_in_any_batch():
    """A row's token must not depend on its neighbours or on the batch size."""
    logits = torch.randn(64, 96, generator=torch.Generator().manual_seed(2)) * 3
    rows = mixed_rows(64)
    full = sample(logits, rows, LocalComm(), 0)
    for lo, hi in [(0, 1), (5, 6), (3, 11), (40, 64)]:
        idx = torch.arange(lo, hi)
        assert torch.equal(sample(logits[lo:hi], rows.select(idx), LocalComm(), 0), full[lo:hi])


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_slices_sample_the_same_tokens_as_one_rank(tp):
    """Each rank sampling its vocab slice (group max, lowest-id ties) must give every rank the
    tp1 token, with top-k/top-p/min-p/penalty rows in the batch."""
    logits = torch.randn(64, 96, generator=torch.Generator().manual_seed(3)) * 3
    rows = mixed_rows(64)
    rows.repetition_penalty[1::3] = 1.4
    rows.frequency_penalty[2::5] = 0.5
    counts = torch.randint(0, 3, (64, 96), generator=torch.Generator().manual_seed(4), dtype=torch.int32)
    on = rows.has_penalty.nonzero()[:, 0]
    full = sample(logits, rows, LocalComm(), 0, PenaltyRows(on, counts[on], None))
    n = 96 // tp
    parts = run_sharded(
        lambda x, comm, off: sample(x, rows, comm, off, PenaltyRows(on, counts[on, off : off + n], None)), logits, tp
    )
    for tokens in parts:
        assert torch.equal(tokens, full)
