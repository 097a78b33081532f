"""Row invariance, the Hadamard rotation and the tie rules."""

import numpy as np
import torch

from dspark_loop.contract.model_config import ModelConfig
from workers.model.layers import hadamard_matrix, linear_rows, matmul_groups, matmul_rows
from workers.model.linear import Linear
from workers.model.moe import Gate


def test_linear_rows_gives_each_row_the_same_bits_whatever_its_neighbours():
    """A row's projection must be bit-identical alone, in any tile position, in any batch size."""
    torch.manual_seed(0)
    lin = Linear(96, 40)
    lin.weight.data.normal_()
    x = torch.randn(29, 96)
    full = linear_rows(lin, x)
    for start, n in [(0, 1), (3, 1), (5, 8), (11, 13), (28, 1)]:
        assert torch.equal(linear_rows(lin, x[start : start + n]), full[start : start + n])


def test_grouped_projection_must_equal_each_group_projected_alone():
    """One bmm over every (group, tile) must give each group's matmul_rows bits, for any row count."""
    torch.manual_seed(1)
    w = torch.randn(4, 16, 64)
    for rows in (0, 1, 7, 8, 29):
        x = torch.randn(rows, 4, 64)
        y = matmul_groups(x, w)
        assert y.shape == (rows, 4, 16)
        for g in range(4):
            assert torch.equal(y[:, g], matmul_rows(x[:, g], w[g]))


def test_hadamard_is_orthonormal_and_keeps_dot_products():
    """The indexer rotation must keep q.k up to rounding (it cancels in the score)."""
    h = hadamard_matrix(16)
    assert torch.allclose(h @ h.T, torch.eye(16), atol=1e-6)
    q, k = torch.randn(4, 16), torch.randn(7, 16)
    assert torch.allclose((q @ h) @ (k @ h).T, q @ k.T, atol=1e-5)


def tiny_cfg(**kw) -> ModelConfig:
    d = dict(
        vocab_size=16,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        q_lora_rank=8,
        o_groups=1,
        o_lora_rank=4,
        compress_ratios=[0, 4],
        n_routed_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=4,
        num_hash_layers=1,
    )
    d.update(kw)
    return ModelConfig.from_dict(d)


def test_router_ties_go_to_the_lowest_expert_id():
    """With every expert scoring the same, the routed top-k must be experts 0 and 1, and the
    weights must be normalised then scaled by routed_scaling_factor."""
    gate = Gate(tiny_cfg(), is_hash=False)
    idx, w = gate(torch.randn(9, 8), torch.zeros(9, dtype=torch.long))  # zero weight: equal scores
    assert idx.tolist() == [[0, 1]] * 9
    assert torch.allclose(w, torch.full((9, 2), 0.75))


def test_hash_router_takes_experts_from_tid2eid():
    """Hash layers must route token t to tid2eid[t], whatever the scores."""
    gate = Gate(tiny_cfg(), is_hash=True)
    gate.tid2eid.copy_(torch.from_numpy(np.random.default_rng(0).integers(0, 6, (16, 2))))
    gate.weight.data.normal_()
    toks = torch.tensor([3, 15, 0])
    idx, w = gate(torch.randn(3, 8), toks)
    assert torch.equal(idx, gate.tid2eid[toks])
    assert torch.allclose(w.sum(-1), torch.full((3,), 1.5))
