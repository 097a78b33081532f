"""The served modules, made trainable: the target's paged prefill with autograd.

    rows [B, S] int -> one packed prefill (B segments, every row a logit row) through
    Transformer.trunk / final_hidden / head: the code the ranks run, with a fresh KVPool
    per call (its in-place slot writes are part of the graph, so it never outlives a step)

Routed experts: MoE.stacked_weights stacks each expert's Linear by copying (.data), which
would cut the gradient, so training owns the stacks as parameters and the MoE reads them
through the same _experts_tiled arithmetic; sync_experts() copies them back before saving.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import BlockUpdate, i32
from workers.comm import LocalComm
from workers.kv_pool import KVPool
from workers.model.layers import linear_rows
from workers.model.moe import MoE
from workers.staging import BlockTables, Segment, stage

BLOCK_SIZE = 32


class ExpertStacks:
    """Per MoE: w1, w3, w2 stacks [E, out, in] as trainable parameters."""

    def __init__(self, module: nn.Module) -> None:
        self.moes = [m for m in module.modules() if isinstance(m, MoE)]
        self.params: list[nn.Parameter] = []
        for moe in self.moes:
            stacks = []
            for name in ("w1", "w3", "w2"):
                w = torch.stack([getattr(e, name).weight.data.float() for e in moe.experts.values()])
                stacks.append(nn.Parameter(w))
            self.params += stacks
            moe._train_stacks = stacks
            moe.stacked_weights = _reader(stacks)

    def state(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    def load(self, tensors: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, t in zip(self.params, tensors):
                p.copy_(t)

    def sync(self) -> None:
        """Copy the trained stacks back into each expert's Linear (for state_dict / export)."""
        for moe in self.moes:
            for name, stack in zip(("w1", "w3", "w2"), moe._train_stacks):
                for i, e in enumerate(moe.experts.values()):
                    getattr(e, name).weight.data = stack.data[i].clone()


def _reader(stacks: list[nn.Parameter]):
    """MoE.stacked_weights' contract: (weight [E, out, in], no W8A8 scale) for w1, w3, w2."""
    return lambda: [(p, None) for p in stacks]


def trainable(module: nn.Module) -> tuple[list[nn.Parameter], ExpertStacks]:
    """Float parameters (experts replaced by their stacks) with requires_grad set."""
    stacks = ExpertStacks(module)
    expert_ids = {
        id(getattr(e, n).weight) for moe in stacks.moes for e in moe.experts.values() for n in ("w1", "w2", "w3")
    }
    params = []
    for name, p in module.named_parameters():
        if id(p) in expert_ids or not p.dtype.is_floating_point or name.endswith("gate.bias"):
            continue
        p.requires_grad_(True)
        params.append(p)
    return params + stacks.params, stacks


class PagedPass:
    """Pages and staging of B sequences of S tokens, each its own request from position 0."""

    def __init__(self, cfg: ModelConfig, num_seqs: int, seq_len: int) -> None:
        self.cfg, self.layout = cfg, CacheLayout.for_model(cfg, BLOCK_SIZE)
        self.num_seqs, self.seq_len = num_seqs, seq_len
        self.tables = BlockTables(len(self.layout.families))
        self.blocks = []
        for fam in self.layout.families:
            n = fam.num_pages(seq_len)
            for r in range(num_seqs):
                self.tables.apply(BlockUpdate(r, fam.index, 0, i32(range(r * n, (r + 1) * n))))
            self.blocks.append(n * num_seqs)

    def pool(self, dtype: torch.dtype) -> KVPool:
        return KVPool(self.cfg, self.layout, self.blocks, dtype)

    def batch(self, rows: np.ndarray, pool: KVPool):
        """rows [B, S] -> the StagedBatch of one prefill of every sequence, all logit rows."""
        segs = [
            Segment(r, 0, rows[r].astype(np.int32), self.seq_len, np.arange(self.seq_len)) for r in range(rows.shape[0])
        ]
        return stage(segs, self.tables, self.layout, self.cfg, pool)


def forward(model, paged: PagedPass, rows: np.ndarray, tap_layers: tuple[int, ...] = ()):
    """rows [B, S] -> logits [B*S, V] fp32, final hidden [B*S, d], taps layer -> [B*S, hc, d]."""
    pool = paged.pool(model.dtype)
    batch = paged.batch(rows, pool)
    h, taps = model.trunk(batch, pool, LocalComm(), tap_layers)
    y = model.final_hidden(h)  # [T, d]
    return linear_rows(model.head, y).float(), y, taps
