"""The C kernels (workers/model/kernels.py) against the torch compositions they replace."""

import pytest
import torch

from workers.model import kernels, layers, mhc

pytestmark = pytest.mark.skipif(kernels.lib() is None, reason="no C compiler: only the torch path runs")

ROWS = (1, 3, 8, 37, 512)


def both(fn, monkeypatch, *args):
    """fn(*args) with the C kernels, then with the torch compositions (fresh copies each)."""
    fast = fn(*(a.clone() for a in args))
    with monkeypatch.context() as m:
        m.setattr(kernels, "lib", lambda: None)
        slow = fn(*(a.clone() for a in args))
    return fast, slow


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("rows", ROWS)
def test_sinkhorn_kernel_must_equal_the_torch_rounds_bit_for_bit(rows, monkeypatch):
    """20 in-place rounds of row/column normalisation must give the torch loop's exact bits."""
    torch.manual_seed(rows)
    comb = torch.softmax(torch.randn(rows, 4, 4) * 4, dim=-1) + 1e-6
    fast, slow = both(lambda c: mhc.sinkhorn_(c, 20, 1e-6), monkeypatch, comb)
    assert same_bits(fast, slow)


@pytest.mark.parametrize("rows", ROWS)
def test_hc_post_and_stream_sums_must_equal_torch_bit_for_bit(rows, monkeypatch):
    """The stream mix and the weighted collapse must give the elementwise torch code's bits."""
    torch.manual_seed(rows)
    h, out = torch.randn(rows, 4, 64), torch.randn(rows, 64)
    post, comb = torch.rand(rows, 4) * 2, torch.softmax(torch.randn(rows, 4, 4), -1)
    assert same_bits(*both(mhc.hc_post, monkeypatch, h, out, post, comb))
    assert same_bits(*both(mhc.weighted_streams, monkeypatch, post, h))


@pytest.mark.parametrize("shape", [(1, 32), (5, 8, 32), (37, 4, 16), (512, 32), (3, 2, 2, 24)])
def test_rope_kernel_must_equal_the_interleaved_torch_rope_bit_for_bit(shape, monkeypatch):
    """Rotating (and un-rotating with -sin) must give the torch composition's bits, with the
    non-rope channels untouched."""
    torch.manual_seed(len(shape))
    x = torch.randn(*shape) * 3
    freqs = torch.arange(shape[0]).float()[:, None] * torch.rand(8)[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    fast, slow = both(layers.apply_rope, monkeypatch, x, cos, sin)
    assert same_bits(fast, slow)
    assert same_bits(*both(layers.apply_rope, monkeypatch, x, cos, -sin))
    assert torch.equal(fast[..., :-16], x[..., :-16])


def test_kernels_must_stand_aside_for_autograd_and_other_dtypes():
    """A tensor that needs a gradient (tools/train_demo) or is not fp32 must take the torch path."""
    x = torch.randn(2, 4, 4, requires_grad=True)
    assert not kernels.fits(x)
    with torch.no_grad():
        assert kernels.fits(x)
    assert not kernels.fits(torch.randn(2, 4, 4).bfloat16())
    assert not kernels.fits(torch.randn(4, 2).t())


@pytest.mark.parametrize("rows", ROWS)
def test_hc_pre_kernels_must_equal_the_torch_composition_bit_for_bit(rows, monkeypatch):
    """The fused mix, sigmoids, softmax + eps, Sinkhorn and collapse must give every output
    (post, comb, collapsed input) the torch composition's bits."""
    torch.manual_seed(rows)
    h, fn = torch.randn(rows, 4, 64), torch.randn(24, 256) * 0.1
    base, scale = torch.randn(24), torch.rand(3) + 0.5
    fast, slow = both(lambda *a: mhc.hc_pre(*a, 20, 1e-6, 1e-6), monkeypatch, h, fn, base, scale)
    assert all(same_bits(a, b) for a, b in zip(fast, slow))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shard", [(0, 6), (2, 5)])
def test_moe_routing_kernels_must_equal_the_numpy_plan_bit_for_bit(rows, shard, monkeypatch):
    """The C tile plan, row gather and expert-ordered combine must give MoE.routed the numpy
    path's bits, on a full expert range and on an EP shard, repeated ids in a row included."""
    from tests.unit.workers.model.test_row_invariance import make_moe

    moe = make_moe(*shard)
    torch.manual_seed(rows)
    x, idx, w = torch.randn(rows, 16), torch.randint(0, 6, (rows, 3)), torch.rand(rows, 3)
    fast, slow = both(moe.routed, monkeypatch, x, idx, w)
    assert same_bits(fast, slow)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", [0, 5, 16, 130])
def test_indexer_choice_must_equal_the_stable_sort_bit_for_bit(rows, n, monkeypatch):
    """The C top-k must pick the stable descending sort's entries in its order: ties (many
    zeros) to the lowest entry, NaN first, -inf for missing slots, -1 past num_visible."""
    from workers.model.attention import choose_entries

    torch.manual_seed(rows * 1000 + n)
    score = (torch.randn(rows, n) * 2).relu().round()  # mostly ties
    if n > 3:
        score[0, 3] = float("nan")
    num_visible = torch.randint(0, n + 1, (rows,))
    col = torch.arange(n)[None, :]
    slots = torch.where(col < num_visible[:, None], torch.randint(0, 999, (rows, n)), torch.full((rows, n), -1))
    fast, slow = both(lambda *a: choose_entries(*a, 8), monkeypatch, score, slots, num_visible)
    assert fast.shape == (rows, 8) and torch.equal(fast, slow)


@pytest.mark.parametrize("shape", [(1, 32), (37, 48), (5, 8, 16), (512, 32)])
def test_swiglu_kernels_must_equal_the_clamped_silu_product_bit_for_bit(shape, monkeypatch):
    """The clamps, silu and product around torch's exp must give the torch composition's bits,
    values past the limit and a NaN included."""
    from workers.model.moe import swiglu

    torch.manual_seed(shape[0])
    gate, up = torch.randn(*shape) * 4, torch.randn(*shape) * 4
    gate.view(-1)[0] = float("nan")
    fast, slow = both(lambda g, u: swiglu(g, u, 2.5), monkeypatch, gate, up)
    assert same_bits(fast, slow)


@pytest.mark.parametrize("rows", ROWS)
def test_attend_logits_kernel_must_equal_the_torch_composition_bit_for_bit(rows, monkeypatch):
    """Scale, key mask (whole rows masked included), the sink column and the max subtraction
    before the softmax must give attend() the torch composition's bits."""
    from workers.model.attention import attend

    torch.manual_seed(rows)
    q, keys, sink = torch.randn(rows, 8, 32), torch.randn(rows, 24, 32), torch.randn(8)
    mask = torch.rand(rows, 24) > 0.3
    mask[0] = False
    fast, slow = both(lambda *a: attend(*a, 32**-0.5), monkeypatch, q, keys, mask, sink)
    assert same_bits(fast, slow)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("is_hash", [False, True])
def test_router_choice_must_equal_the_stable_sort_bit_for_bit(rows, is_hash, monkeypatch):
    """The C top-k of scores + bias (ties to the lowest expert id) and the weight gather must
    give Gate the stable sort's experts and weights; hash routing keeps its table's ids."""
    from tests.unit.workers.model.test_layers import tiny_cfg
    from workers.model.moe import Gate

    cfg = tiny_cfg(hidden_size=16, n_routed_experts=6, num_experts_per_tok=2)
    gate = Gate(cfg, is_hash)
    torch.manual_seed(rows)
    gate.weight.data.normal_()
    if is_hash:
        gate.tid2eid.copy_(torch.randint(0, 6, gate.tid2eid.shape))
    else:
        gate.bias.data.copy_(torch.tensor([0.0, 0.5, 0.5, 0.0, -1.0, 0.5]))  # ties after the add
    x = torch.randn(rows, 16).round()  # repeated scores
    tokens = torch.randint(0, cfg.vocab_size, (rows,))
    fast, slow = both(lambda a, t: gate(a, t), monkeypatch, x, tokens)
    assert torch.equal(fast[0], slow[0]) and same_bits(fast[1], slow[1])
