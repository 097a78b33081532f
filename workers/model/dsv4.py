"""DeepSeek-V4 trunk over paged caches: one forward over a packed batch of segments.

    embed -> [hc streams x4] -> layers.N: (hc_attn, attn_norm, attn) (hc_ffn, ffn_norm, ffn)
          -> hc_head -> norm -> head (vocab-sharded) -> greedy argmax across the TP group

Parameter names are the DeepSeek-native checkpoint names, so a native state_dict loads
as is (workers/weights.py maps transformers' layout onto them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from dspark_loop.contract.model_config import ModelConfig
from workers.comm import Comm
from workers.kv_pool import KVPool
from workers.model.attention import Attention
from workers.model.config import LocalDims, compress_inv_freq, main_inv_freq
from workers.model.layers import RMSNorm, hadamard_matrix, linear_rows
from workers.model.linear import Linear
from workers.model.mhc import hc_head, hc_post, hc_pre
from workers.model.moe import MoE
from workers.staging import StagedBatch


@dataclass
class StepContext:
    batch: StagedBatch
    pool: KVPool
    comm: Comm
    rope_main: tuple[torch.Tensor, torch.Tensor]  # cos, sin [T, rd/2] at the rows' positions
    rope_compress: tuple[torch.Tensor, torch.Tensor]
    rope_emit: dict[int, tuple[torch.Tensor, torch.Tensor]]  # per ratio, at the emitted j*r
    hadamard: torch.Tensor | None


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [L, V/tp] fp32, the batch's logit rows in order
    token_ids: torch.Tensor  # [L] greedy (global vocab ids, lowest id wins a tie)
    taps: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [rows, hc, d]


def _hc_params(n: int, hidden: int, hc: int) -> tuple[nn.Parameter, ...]:
    return (
        nn.Parameter(torch.zeros(n, hc * hidden), requires_grad=False),
        nn.Parameter(torch.zeros(n), requires_grad=False),
        nn.Parameter(torch.zeros(3 if n > hc else 1), requires_grad=False),
    )


class Embedding(nn.Module):
    """A plain table (nn.Embedding's random init is slow even on the meta device)."""

    def __init__(self, vocab: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab, hidden, dtype=dtype), requires_grad=False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        return self.weight.index_select(0, token_ids)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dims: LocalDims, dtype: torch.dtype, w8a8) -> None:
        super().__init__()
        self.cfg = cfg
        n = (2 + cfg.hc_mult) * cfg.hc_mult
        self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale = _hc_params(n, cfg.hidden_size, cfg.hc_mult)
        self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale = _hc_params(n, cfg.hidden_size, cfg.hc_mult)
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer, dims, dtype, w8a8)
        self.ffn = MoE(cfg, layer, dims, dtype, w8a8)

    def forward(self, h: torch.Tensor, ctx: StepContext) -> torch.Tensor:  # h [T, hc, d]
        c = self.cfg
        post, comb, y = hc_pre(
            h, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps
        )
        h = hc_post(h, self.attn(self.attn_norm(y), ctx), post, comb)
        post, comb, y = hc_pre(
            h, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps
        )
        return hc_post(h, self.ffn(self.ffn_norm(y), ctx.batch.token_ids, ctx.comm), post, comb)


class Transformer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, dims: LocalDims, dtype: torch.dtype, w8a8=lambda name: False, hadamard: bool = True
    ) -> None:
        super().__init__()
        self.cfg, self.dims, self.dtype, self.use_hadamard = cfg, dims, dtype, hadamard
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(Block(cfg, i, dims, dtype, w8a8) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hc_head_fn, self.hc_head_base, self.hc_head_scale = _hc_params(cfg.hc_mult, cfg.hidden_size, cfg.hc_mult)
        self.head = Linear(cfg.hidden_size, dims.vocab_size, dtype)
        self._tables: dict | None = None

    def _rope_tables(self, device) -> dict:
        if self._tables is None:
            t = {"main": main_inv_freq(self.cfg).to(device), "compress": compress_inv_freq(self.cfg).to(device)}
            needs = self.use_hadamard and any(self.cfg.is_csa(i) for i in range(self.cfg.num_hidden_layers))
            t["hadamard"] = hadamard_matrix(self.cfg.index_head_dim).to(device) if needs else None
            self._tables = t
        return self._tables

    def context(self, batch: StagedBatch, pool: KVPool, comm: Comm) -> StepContext:
        from workers.model.layers import rope_cos_sin

        t = self._rope_tables(batch.positions.device)
        emit = {r: rope_cos_sin(t["compress"], ri.emit_pos, self.dtype) for r, ri in batch.ratios.items()}
        return StepContext(
            batch,
            pool,
            comm,
            rope_cos_sin(t["main"], batch.positions, self.dtype),
            rope_cos_sin(t["compress"], batch.positions, self.dtype),
            emit,
            t["hadamard"],
        )

    @torch.no_grad()
    def forward(
        self,
        batch: StagedBatch,
        pool: KVPool,
        comm: Comm,
        tap_layers: tuple[int, ...] = (),
        tap_rows: torch.Tensor | None = None,
    ) -> ForwardOutput:
        h, taps = self.trunk(batch, pool, comm, tap_layers, tap_rows)
        y = self.final_hidden(h[batch.logit_rows])  # [L, d]
        logits = linear_rows(self.head, y).float()  # [L, V/tp]
        tokens = comm.argmax_tp(logits, self.dims.vocab_offset) if logits.shape[0] else torch.zeros(0, dtype=torch.long)
        return ForwardOutput(logits, tokens, taps)

    def trunk(
        self,
        batch: StagedBatch,
        pool: KVPool,
        comm: Comm,
        tap_layers: tuple[int, ...] = (),
        tap_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """embed -> layers: h [T, hc, d] after the last layer, taps layer -> [rows, hc, d].
        No grad decorator: tools/train_demo trains through this same code."""
        ctx = self.context(batch, pool, comm)
        x = self.embed(batch.token_ids)  # [T, d]
        h = x.unsqueeze(1).expand(-1, self.cfg.hc_mult, -1).contiguous()  # [T, hc, d]
        taps = {}
        for i, layer in enumerate(self.layers):
            h = layer(h, ctx)
            if i in tap_layers:
                taps[i] = h if tap_rows is None else h[tap_rows]
        return h, taps

    def final_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """h [L, hc, d] -> the head's input [L, d] (hc_head, norm)."""
        return self.norm(
            hc_head(h, self.hc_head_fn, self.hc_head_base, self.hc_head_scale, self.cfg.hc_eps, self.cfg.rms_norm_eps)
        )
