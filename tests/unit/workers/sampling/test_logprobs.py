"""Logprobs of raw logits across vocab slices: torch's log_softmax to fp32 rounding, the same
bits on every TP split, top-N by (logprob desc, id asc)."""

import pytest
import torch

from tests.unit.workers.sampling.sharded import gather_slices, run_sharded
from workers.comm import LocalComm
from workers.sampling.logprobs import log_softmax_sharded, token_logprobs, top_logprobs

V = 96


def logits_for_test() -> torch.Tensor:
    x = torch.randn(12, V, generator=torch.Generator().manual_seed(0)) * 4
    x[1] = 0.0  # uniform row
    x[2, 7] = 60.0  # one dominant id
    x[3, :50] = float("-inf")  # a constrained row: half the vocabulary refused
    x[4] = x[4].round()  # ties
    return x


def test_logprobs_equal_torch_log_softmax_within_fp32_rounding():
    """log_softmax_sharded must equal torch.log_softmax in fp32 (the reference computed in fp64)."""
    x = logits_for_test()
    ours = log_softmax_sharded(x, LocalComm())
    ref = torch.log_softmax(x.double(), dim=-1).float()
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(ours, torch.log_softmax(x, dim=-1), rtol=1e-6, atol=5e-6)


@pytest.mark.parametrize("tp", [2, 4])
def test_every_tp_split_gives_the_same_logprob_bits(tp):
    """Sliced rows (normaliser summed across ranks) must give the tp1 values bit for bit,
    and the sampled ids' logprobs and the top-N lists must match too."""
    x = logits_for_test()
    tokens = torch.tensor([0, 5, 7, 60, 95, 13, 40, 41, 88, 2, 3, 70])

    def per_rank(sl, comm, off):
        lp = log_softmax_sharded(sl, comm)
        return lp, token_logprobs(lp, tokens, off, comm), top_logprobs(lp, 5, off, comm)

    lp1, tok1, (ids1, top1) = per_rank(x, LocalComm(), 0)
    parts = run_sharded(per_rank, x, tp)
    assert torch.equal(gather_slices([p[0] for p in parts]), lp1)
    for _, tok, (ids, top) in parts:
        assert torch.equal(tok, tok1) and torch.equal(ids, ids1) and torch.equal(top, top1)


def test_top_entries_are_sorted_with_lowest_id_first_among_ties():
    """Top-N must list the N best ids by logprob, ties broken by the lowest id (a stable sort),
    with their exact logprob values; the sampled ids' logprobs are read from the full row."""
    x = logits_for_test()
    lp = log_softmax_sharded(x, LocalComm())
    ids, vals = top_logprobs(lp, 6, 0, LocalComm())
    order = torch.sort(lp, dim=-1, descending=True, stable=True).indices[:, :6]
    assert torch.equal(ids, order)
    assert torch.equal(vals, lp.gather(1, order))
    tokens = torch.arange(12) * 7
    assert torch.equal(token_logprobs(lp, tokens, 0, LocalComm()), lp[torch.arange(12), tokens])


def test_top_n_larger_than_a_slice_still_returns_the_global_top():
    """N above V/tp (each rank can offer only its slice) must still give the global top N."""
    x = logits_for_test()
    lp1 = log_softmax_sharded(x, LocalComm())
    ids1, _ = top_logprobs(lp1, 40, 0, LocalComm())
    parts = run_sharded(lambda sl, comm, off: top_logprobs(log_softmax_sharded(sl, comm), 40, off, comm)[0], x, 4)
    assert all(torch.equal(p, ids1) for p in parts)


def test_a_rows_logprobs_do_not_depend_on_the_other_rows():
    """A row's logprobs and top entries must have the same bits alone and in the batch."""
    x = logits_for_test()
    lp = log_softmax_sharded(x, LocalComm())
    ids, vals = top_logprobs(lp, 4, 0, LocalComm())
    for r in (0, 3, 11):
        alone = log_softmax_sharded(x[r : r + 1], LocalComm())
        assert torch.equal(alone, lp[r : r + 1])
        a_ids, a_vals = top_logprobs(alone, 4, 0, LocalComm())
        assert torch.equal(a_ids, ids[r : r + 1]) and torch.equal(a_vals, vals[r : r + 1])
