"""Processor masks equal a plain reference (transformers' warpers, vLLM's penalty formulas),
and every TP split keeps the same ids."""

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tests.unit.workers.sampling.sharded import gather_slices, run_sharded
from workers.comm import LocalComm
from workers.sampling.processors import PenaltyRows, apply_penalties, filter_logits
from workers.sampling.rows import SamplingRows
from workers.sampling.thresholds import order_keys, threshold_over

V = 96
NO_IDS = torch.zeros(1, 0, dtype=torch.long)


def random_logits(rows: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * scale


def reference_filter(logits: torch.Tensor, t: float, min_p: float, top_k: int, top_p: float) -> torch.Tensor:
    """One row through transformers' warpers in vLLM's order: T, min-p, top-k, top-p."""
    x = logits[None] / t
    if min_p > 0:
        x = MinPLogitsWarper(min_p)(NO_IDS, x)
    if top_k > 0:
        x = TopKLogitsWarper(top_k)(NO_IDS, x)
    if top_p < 1:
        x = TopPLogitsWarper(top_p)(NO_IDS, x)
    return x[0]


SETTINGS = [  # (temperature, min_p, top_k, top_p)
    (1.0, 0.0, 0, 0.9),
    (0.7, 0.0, 5, 1.0),
    (1.3, 0.05, 0, 1.0),
    (1.0, 0.0, 20, 0.5),
    (0.5, 0.1, 40, 0.95),
    (2.0, 0.0, 1, 1.0),
    (1.0, 0.0, 0, 0.01),
    (1.0, 0.02, 64, 0.99),
]


def test_filters_keep_exactly_the_ids_transformers_warpers_keep():
    """min-p, top-k and top-p (alone and chained) must drop exactly the ids the reference
    drops, and scale the kept ones by 1/T bit for bit."""
    logits = random_logits(len(SETTINGS) * 4, seed=0)
    rows = SamplingRows.make(
        len(logits),
        temperature=[s[0] for s in SETTINGS for _ in range(4)],
        min_p=[s[1] for s in SETTINGS for _ in range(4)],
        top_k=[s[2] for s in SETTINGS for _ in range(4)],
        top_p=[s[3] for s in SETTINGS for _ in range(4)],
    )
    ours = filter_logits(logits, rows, V, LocalComm())
    for r, row in enumerate(logits):
        ref = reference_filter(row, *SETTINGS[r // 4])
        assert torch.equal(ours[r] == float("-inf"), ref == float("-inf")), (r, SETTINGS[r // 4])
        kept = ref > float("-inf")
        assert torch.equal(ours[r][kept], ref[kept])


def test_ties_at_the_edge_are_kept_together():
    """Equal values must be kept or dropped together (the rule is a function of values, not
    positions): top-k 2 over [5, 3, 3, 3, 1] keeps the three 3s, as transformers' top-k."""
    row = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0, -1.0, -2.0]])
    rows = SamplingRows.make(1, temperature=1.0, top_k=2)
    out = filter_logits(row, rows, 8, LocalComm())
    assert (out[0] > float("-inf")).tolist() == [True, True, True, True, False, False, False, False]


def test_threshold_search_matches_a_sort_on_random_weights():
    """threshold_over must return the smallest key t with W(key > t) < budget, checked
    against a brute-force scan of every candidate (keys with many duplicates)."""
    g = torch.Generator().manual_seed(3)
    keys = torch.randint(0, 1 << 32, (50, 40), generator=g)
    keys[:, 20:] = keys[:, :20]  # duplicates
    weights = torch.randint(0, 1000, (50, 40), generator=g)
    budget = torch.rand(50, generator=g, dtype=torch.float64) * weights.sum(1).double() + 0.5
    t = threshold_over(keys, weights, budget, LocalComm())
    for r in range(50):

        def mass_above(x, r=r):
            return int(weights[r][keys[r] > x].sum())

        cands = sorted(set(keys[r].tolist()) | {0})
        # the answer is either 0 or one past an element (F only steps just above an element)
        best = min(c for c in cands + [k + 1 for k in cands] if mass_above(c) < budget[r])
        assert int(t[r]) == best


def test_repetition_penalty_equals_transformers_and_counts_give_vllms_penalties():
    """Repetition (prompt or output ids) must equal transformers' processor; frequency and
    presence must subtract f*count and p*[count>0] (vLLM's formulas); neutral rows untouched."""
    logits = random_logits(3, seed=4)
    prompt_ids, out_ids = [3, 3, 10, 50], [10, 7, 7, 7, 90]
    counts = torch.zeros(3, V, dtype=torch.int32)
    for i in out_ids:
        counts[:, i] += 1
    prompt_mask = torch.zeros(3, V, dtype=torch.bool)
    prompt_mask[:, prompt_ids] = True
    rows = SamplingRows.make(
        3, repetition_penalty=[1.3, 1.0, 1.0], frequency_penalty=[0.0, 0.4, 0.0], presence_penalty=[0.0, -0.5, 0.0]
    )
    out = apply_penalties(logits, rows, PenaltyRows(torch.arange(2), counts[:2], prompt_mask[:2]))
    ids = torch.tensor([prompt_ids + out_ids])
    assert torch.equal(out[0], RepetitionPenaltyLogitsProcessor(1.3)(ids, logits[:1].clone())[0])
    expect = logits[1].clone()
    for i in range(V):
        expect[i] = expect[i] - 0.4 * float(counts[1, i])
        expect[i] = expect[i] - (-0.5) * float(counts[1, i] > 0)
    torch.testing.assert_close(out[1], expect, rtol=0, atol=1e-6)
    assert torch.equal(out[2], logits[2])


@pytest.mark.parametrize("tp", [2, 4])
def test_every_tp_split_keeps_the_same_ids_with_the_same_bits(tp):
    """filter_logits on tp slices (in-process ranks) must equal the tp1 result bit for bit,
    including top-p, whose masses are summed across slices."""
    logits = random_logits(len(SETTINGS) * 4, seed=5, scale=4.0)
    kw = dict(
        temperature=[s[0] for s in SETTINGS for _ in range(4)],
        min_p=[s[1] for s in SETTINGS for _ in range(4)],
        top_k=[s[2] for s in SETTINGS for _ in range(4)],
        top_p=[s[3] for s in SETTINGS for _ in range(4)],
    )
    rows = SamplingRows.make(len(logits), **kw)
    full = filter_logits(logits, rows, V, LocalComm())
    parts = run_sharded(lambda x, comm, off: filter_logits(x, rows, V, comm), logits, tp)
    assert torch.equal(gather_slices(parts), full)


def test_order_keys_sort_like_the_floats():
    """order_keys must be monotone over floats, -inf lowest, -0.0 just below 0.0."""
    x = torch.tensor([float("-inf"), -3e38, -1.0, -1e-30, -0.0, 0.0, 1e-30, 1.0, 3e38, float("inf")])
    k = order_keys(x)
    assert (k[1:] > k[:-1]).all() and (k >= 0).all() and (k < (1 << 32)).all()
