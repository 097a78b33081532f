"""Row invariance of the fast paths: one bmm over 8-row tiles, whole-batch mHC / norms /
pointwise ops, and the grouped MoE. Each row's bits must not depend on its neighbours."""

import pytest
import torch
import torch.nn.functional as F

from tests.unit.workers.model.test_layers import tiny_cfg
from workers.model import layers
from workers.model.config import LocalDims
from workers.model.layers import ROW_TILE, linear_rows, matmul_rows
from workers.model.linear import Linear, quantize_weight
from workers.model.mhc import hc_pre
from workers.model.moe import MoE

SIZES = [(0, 1), (3, 1), (0, 8), (5, 9), (2, 64), (0, 200)]  # (start, rows) windows of one batch


def assert_rows_invariant(fn, *xs):
    full = fn(*xs)
    full = full if isinstance(full, tuple) else (full,)
    for start, n in SIZES:
        part = fn(*(x[start : start + n] for x in xs))
        for a, b in zip(part if isinstance(part, tuple) else (part,), full):
            assert torch.equal(a, b[start : start + n]), (start, n)


def test_matmul_rows_gives_every_row_its_own_eight_row_gemm_bits():
    """One bmm over [tiles, 8, in] must equal F.linear on each zero-padded 8-row tile, bit for bit."""
    torch.manual_seed(0)
    w, x = torch.randn(24, 256), torch.randn(27, 256)
    padded = torch.cat([x, x.new_zeros(5, 256)])
    per_tile = torch.cat([F.linear(padded[i : i + ROW_TILE], w) for i in range(0, 32, ROW_TILE)])[:27]
    assert torch.equal(matmul_rows(x, w), per_tile)
    assert_rows_invariant(lambda t: matmul_rows(t, w), torch.randn(210, 256))


@pytest.mark.parametrize("k, out", [(64, 32), (32, 256), (64, 4), (256, 24), (256, 4), (16, 8), (4096, 1024)])
def test_one_tile_rows_must_have_the_bits_they_get_in_a_many_tile_batch(k, out):
    """matmul_rows on up to 8 rows (one tile: a plain gemm) must give each row the bits the
    same row gets among many tiles (one bmm), for the model's projection shapes."""
    torch.manual_seed(k + out)
    w, x = torch.randn(out, k), torch.randn(40, k)
    full = matmul_rows(x, w)
    for start, n in ((0, 1), (3, 1), (0, 8), (5, 3), (32, 8)):
        assert torch.equal(matmul_rows(x[start : start + n], w), full[start : start + n]), (start, n)


def test_w8a8_linear_rows_matches_linear_forward_on_each_tile():
    """linear_rows' W8A8 path must be Linear.forward's arithmetic, bit for bit, per 8-row tile."""
    torch.manual_seed(1)
    lin = Linear(64, 40, w8a8=True)
    q, s = quantize_weight(torch.randn(40, 64))
    lin.weight.data.copy_(q)
    lin.scale.data.copy_(s)
    x = torch.randn(16, 64)
    assert torch.equal(linear_rows(lin, x), torch.cat([lin(x[:8]), lin(x[8:])]))
    assert_rows_invariant(lambda t: linear_rows(lin, t), torch.randn(210, 64))


def test_exact_pointwise_ops_match_torch_and_ignore_the_tensor_size():
    """sigmoid/silu/softplus/rsqrt must agree with torch's to rounding, and an element's bits
    must not depend on how many elements share the call (torch's own differ in the tail)."""
    x = torch.linspace(-30, 30, 1001)
    pos = torch.linspace(1e-3, 50, 1001)
    cases = [
        (layers.sigmoid, torch.sigmoid, x),
        (layers.silu, F.silu, x),
        (layers.softplus, F.softplus, x),
        (layers.rsqrt, torch.rsqrt, pos),
    ]
    for ours, ref, inp in cases:
        full = ours(inp)
        torch.testing.assert_close(full, ref(inp), rtol=1e-6, atol=1e-7)
        alone = torch.cat([ours(inp[i : i + 3]) for i in range(0, 1001, 3)])
        assert torch.equal(full, alone), ours.__name__


def test_hc_pre_and_rmsnorm_give_a_row_the_same_bits_in_any_batch():
    """The whole-batch Sinkhorn and norms must give each row its bits alone or among 200."""
    torch.manual_seed(2)
    fn, base, scale = torch.randn(24, 256) * 0.1, torch.randn(24), torch.rand(3)
    assert_rows_invariant(lambda h: hc_pre(h, fn, base, scale, 20, 1e-6, 1e-6), torch.randn(210, 4, 64))
    norm = layers.RMSNorm(64, 1e-6)
    norm.weight.data.normal_()
    assert_rows_invariant(norm, torch.randn(210, 64) * 3)


def make_moe(lo=0, hi=6, seed=3):
    cfg = tiny_cfg(hidden_size=16, n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=8)
    dims = LocalDims(
        num_heads=2,
        head_offset=0,
        num_groups=1,
        group_offset=0,
        expert_lo=lo,
        expert_hi=hi,
        vocab_size=16,
        vocab_offset=0,
    )
    moe = MoE(cfg, 1, dims, torch.float32, lambda name: False)
    torch.manual_seed(seed)
    for p in moe.parameters():
        p.data.normal_()
    return moe


def routing(rows):
    return torch.stack([torch.randperm(6)[:2] for _ in range(rows)]), torch.rand(rows, 2)  # distinct experts


def test_grouped_experts_equal_each_expert_run_alone_and_sum_in_expert_order():
    """MoE.routed must equal running every chosen expert on its tokens and adding the weighted
    outputs per token in ascending expert id, bit for bit, and stay row-invariant."""
    moe = make_moe()
    x = torch.randn(37, 16)
    idx, w = routing(37)
    expect = torch.zeros_like(x)
    for t in range(37):
        for slot in idx[t].argsort():
            e = int(idx[t, slot])
            expect[t] = expect[t] + moe.experts[str(e)](x[t : t + 1])[0] * w[t, slot]
    assert torch.equal(moe.routed(x, idx, w), expect)
    assert_rows_invariant(moe.routed, torch.randn(210, 16), *routing(210))


def test_expert_shards_add_up_to_the_whole_bit_for_bit():
    """Two EP shards' partial sums, added in rank order, must equal one rank holding all experts."""
    whole, low, high = make_moe(), make_moe(0, 3), make_moe(3, 6)
    for e in range(6):
        (low if e < 3 else high).experts[str(e)].load_state_dict(whole.experts[str(e)].state_dict())
    x = torch.randn(40, 16)
    idx, w = routing(40)
    assert torch.equal(low.routed(x, idx, w) + high.routed(x, idx, w), whole.routed(x, idx, w))


def test_expert_stack_follows_replaced_weights():
    """Assigning new expert weights (load_state_dict(assign=True)) must rebuild the stacked
    weights, so routed outputs use the new values."""
    moe = make_moe()
    x, idx, w = torch.randn(5, 16), torch.tensor([[0, 1]] * 5), torch.ones(5, 2)
    before = moe.routed(x, idx, w)
    state = {k: v.clone() * 2 if ".w2." in k else v.clone() for k, v in moe.state_dict().items()}
    moe.load_state_dict(state, assign=True)
    torch.testing.assert_close(moe.routed(x, idx, w), before * 2)
