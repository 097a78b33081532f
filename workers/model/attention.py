"""Shared-KV MQA over the paged caches: a sliding window of raw KV plus compressed
entries (all visible ones for HCA, the indexer's top-k for CSA), with a per-head sink.

Per layer and step: project this step's rows, scatter raw kv and compressor states into
the swa ring at their slots, emit the entries whose boundary row is in this step into the
c{r} family, then every row gathers its keys by slot and attends. Key widths are fixed per
row (window; window + index_topk; window + its own bucketed HCA count), never by the batch,
so a row's bits never depend on its neighbours.
"""

from __future__ import annotations

import torch
from torch import nn

from dspark_loop.contract.model_config import ModelConfig
from workers.model import kernels
from workers.model.compressor import Compressor
from workers.model.config import LocalDims
from workers.model.layers import (
    RMSNorm,
    apply_rope,
    cast,
    linear_rows,
    matmul_groups,
    matmul_rows,
    rms_unweighted,
    take_rows,
)
from workers.model.linear import Linear
from workers.staging import RatioIndex


def attend(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, H, D], keys [T, K, D] (K = V), mask [T, K], sink [H] -> [T, H, D].
    All rows at once: each row's bmm is its own [H, D] x [D, K] product and the softmax is
    over the last dim, both row-invariant (measured; see layers). An explicit bmm, not einsum:
    the same kernel call (same bits) without einsum's parsing and permutes."""
    logits = torch.bmm(q, keys.transpose(1, 2))  # [T, H, K]
    k = kernels.lib()
    if k is not None and kernels.fits(logits, sink) and mask.dtype == torch.bool and mask.is_contiguous():
        rows, heads, num_keys = logits.shape
        combined = logits.new_empty(rows, heads, num_keys + 1)  # scale, mask, sink, minus max: in C
        k.attn_logits(
            logits.data_ptr(), mask.data_ptr(), sink.data_ptr(), combined.data_ptr(), rows, heads, num_keys, scale
        )
    else:
        logits = (logits * scale).masked_fill(~mask[:, None, :], float("-inf"))
        sinks = sink.to(logits.dtype)[None, :, None].expand(q.shape[0], -1, 1)  # [T, H, 1]
        combined = torch.cat([logits, sinks], dim=-1)  # [T, H, K+1]
        combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)[..., :-1]  # the sink carries no value
    return torch.bmm(cast(probs, keys.dtype), keys)  # [T, H, D]


def emit_entries(
    comp: Compressor,
    state_kv: torch.Tensor,
    state_score: torch.Tensor,
    ri: RatioIndex,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """Entries [E, dim] (normed, roped at j*r) pooled from the swa state rows by slot."""
    idx, valid = ri.state_gather  # [E, S]
    entries = comp.pool(take_rows(state_kv, idx), take_rows(state_score, idx), valid)
    return apply_rope(entries, cos, sin)


def choose_entries(score: torch.Tensor, slots: torch.Tensor, num_visible: torch.Tensor, topk: int) -> torch.Tensor:
    """The indexer's top-k: score [T, N] fp32, slots [T, N] (-1: no entry), num_visible [T] ->
    the slots [T, topk] of the best entries in descending score, -1 past num_visible.

    NOTE: ties (relu zeros are common) go to the LOWEST entry: a stable descending sort (or the
    C selection in the same order), never torch.topk, whose tie order changes with the shape."""
    rows, n = score.shape
    k = kernels.lib()
    if k is not None and topk <= 1024 and kernels.fits(score) and kernels.fits_index(slots, num_visible):
        chosen = torch.empty(rows, topk, dtype=torch.long, device=score.device)
        k.topk_slots(score.data_ptr(), slots.data_ptr(), num_visible.data_ptr(), chosen.data_ptr(), rows, n, topk)
        return chosen
    score = score.masked_fill(slots < 0, float("-inf"))
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :topk]
    chosen = slots.gather(1, order)
    rank = torch.arange(order.shape[1], device=order.device)[None, :]
    chosen = torch.where(rank < num_visible[:, None], chosen, torch.full_like(chosen, -1))
    if chosen.shape[1] < topk:
        chosen = torch.cat([chosen, chosen.new_full((rows, topk - chosen.shape[1]), -1)], 1)
    return chosen


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, w8a8, prefix: str) -> None:
        super().__init__()
        self.num_heads, self.dim, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.wq_b = Linear(cfg.q_lora_rank, self.num_heads * self.dim, dtype, w8a8(prefix + "wq_b"))
        self.weights_proj = Linear(cfg.hidden_size, self.num_heads, dtype)
        self.compressor = Compressor(cfg.hidden_size, self.dim, cfg.csa_ratio, True, cfg.rms_norm_eps, dtype)

    def select(
        self,
        x: torch.Tensor,
        qr: torch.Tensor,
        keys_cache: torch.Tensor,
        ri: RatioIndex,
        cos: torch.Tensor,
        sin: torch.Tensor,
        hadamard: torch.Tensor | None,
    ) -> torch.Tensor:
        """c{r} slots [T, topk] of each row's chosen entries, -1 where fewer are visible."""
        rows = x.shape[0]
        q = linear_rows(self.wq_b, qr).view(rows, self.num_heads, self.dim)
        q = apply_rope(q, cos, sin)
        if hadamard is not None:
            q = matmul_rows(q, hadamard.t())  # [T, nh, di] @ H
        slots = ri.key_slots  # [T, N]
        gather, _ = ri.key_gather
        keys = take_rows(keys_cache, gather)  # [T, N, di]
        scores = torch.bmm(q.float(), keys.float().transpose(1, 2))  # [T, nh, N] per-row products
        scores = scores.relu() * self.dim**-0.5  # [T, nh, N]
        w = linear_rows(self.weights_proj, x).float() * self.num_heads**-0.5  # [T, nh]
        score = (scores * w[..., None]).sum(dim=1)  # [T, N]
        return choose_entries(score, slots, ri.num_visible, self.topk)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dims: LocalDims, dtype: torch.dtype, w8a8) -> None:
        super().__init__()
        p = f"layers.{layer}.attn."
        self.layer, self.ratio = layer, cfg.compress_ratios[layer]
        self.is_csa = cfg.is_csa(layer)
        self.num_heads, self.head_dim = dims.num_heads, cfg.head_dim
        self.num_groups, self.eps = dims.num_groups, cfg.rms_norm_eps
        self.attn_sink = nn.Parameter(torch.zeros(dims.num_heads, dtype=torch.float32), requires_grad=False)
        self.wq_a = Linear(cfg.hidden_size, cfg.q_lora_rank, dtype, w8a8(p + "wq_a"))
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.wq_b = Linear(cfg.q_lora_rank, dims.num_heads * cfg.head_dim, dtype, w8a8(p + "wq_b"))
        self.wkv = Linear(cfg.hidden_size, cfg.head_dim, dtype, w8a8(p + "wkv"))
        self.kv_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        group_in = cfg.num_attention_heads * cfg.head_dim // cfg.o_groups
        self.wo_a = Linear(group_in, dims.num_groups * cfg.o_lora_rank, dtype)
        self.wo_b = Linear(dims.num_groups * cfg.o_lora_rank, cfg.hidden_size, dtype, w8a8(p + "wo_b"))
        self.compressor = self.indexer = None
        if self.ratio:
            self.compressor = Compressor(
                cfg.hidden_size, cfg.head_dim, self.ratio, self.is_csa, cfg.rms_norm_eps, dtype
            )
        if self.is_csa:
            self.indexer = Indexer(cfg, dtype, w8a8, p + "indexer.")

    def forward(self, x: torch.Tensor, ctx) -> torch.Tensor:  # x [T, hidden] -> [T, hidden]
        rows, L, b, pool = x.shape[0], self.layer, ctx.batch, ctx.pool
        cos, sin = ctx.rope_compress if self.ratio else ctx.rope_main  # [T, rd/2]
        qr = self.q_norm(linear_rows(self.wq_a, x))  # [T, q_lora]
        q = linear_rows(self.wq_b, qr).view(rows, self.num_heads, self.head_dim)
        q = apply_rope(rms_unweighted(q, self.eps), cos, sin)  # [T, H, D]
        kv = apply_rope(self.kv_norm(linear_rows(self.wkv, x)), cos, sin)  # [T, D]
        pool.raw_kv[L][b.write_slots] = cast(kv, pool.dtype)
        gather, mask = b.raw_gather  # [T, W]
        keys = take_rows(pool.raw_kv[L], gather, q.dtype)  # [T, W, D]
        scale = self.head_dim**-0.5
        if not self.ratio:
            out = attend(q, keys, mask, self.attn_sink, scale)
        else:
            ri = b.ratios[self.ratio]
            ckv, cscore = self.compressor.project(x)
            pool.state_kv[L][b.write_slots] = cast(ckv, pool.dtype)
            pool.state_score[L][b.write_slots] = cast(cscore, pool.dtype)
            ecos, esin = ctx.rope_emit[self.ratio]
            if ri.emit_rows.numel():
                entries = emit_entries(self.compressor, pool.state_kv[L], pool.state_score[L], ri, ecos, esin)
                pool.comp_kv[L][ri.write_slots] = cast(entries, pool.dtype)
            if self.is_csa:
                out = self._sparse(x, qr, q, keys, mask, ri, ctx, cos, sin, ecos, esin, scale)
            else:
                out = self._dense_compressed(q, keys, mask, ri, pool.comp_kv[L], scale)
        out = apply_rope(out, cos, -sin)  # undo the rotation V picked up, at the query position
        grouped = out.reshape(rows, self.num_groups, self.num_heads // self.num_groups * self.head_dim)
        w = self.wo_a.weight.view(self.num_groups, -1, grouped.shape[-1])  # [G, R, H/G*D]
        y = matmul_groups(grouped, w)  # [T, G, R]
        return ctx.comm.sum_tp(linear_rows(self.wo_b, y.flatten(1)))

    def _sparse(self, x, qr, q, keys, mask, ri, ctx, cos, sin, ecos, esin, scale):
        L, pool, b, idx = self.layer, ctx.pool, ctx.batch, self.indexer
        ikv, iscore = idx.compressor.project(x)
        pool.index_state_kv[L][b.write_slots] = cast(ikv, pool.dtype)
        pool.index_state_score[L][b.write_slots] = cast(iscore, pool.dtype)
        if ri.emit_rows.numel():
            ikeys = emit_entries(idx.compressor, pool.index_state_kv[L], pool.index_state_score[L], ri, ecos, esin)
            if ctx.hadamard is not None:
                ikeys = matmul_rows(ikeys, ctx.hadamard.t())  # [E, di] @ H
            pool.index_keys[L][ri.write_slots] = cast(ikeys, pool.dtype)
        chosen = idx.select(
            x, qr, pool.index_keys[L], ri, ctx.rope_compress[0], ctx.rope_compress[1], ctx.hadamard
        )  # [T, topk]
        ckeys = take_rows(pool.comp_kv[L], chosen.clamp(min=0), q.dtype)  # [T, topk, D]
        return attend(q, torch.cat([keys, ckeys], 1), torch.cat([mask, chosen >= 0], 1), self.attn_sink, scale)

    def _dense_compressed(self, q, keys, mask, ri: RatioIndex, comp_kv, scale):
        gather, real = ri.key_gather  # [T, N]
        groups = ri.width_groups  # rows by their bucketed width (KEY_BUCKET)
        if len(groups) == 1:
            w = groups[0][0]
            k = torch.cat([keys, take_rows(comp_kv, gather[:, :w], q.dtype)], 1)
            return attend(q, k, torch.cat([mask, real[:, :w]], 1), self.attn_sink, scale)
        out = torch.empty_like(q)
        for w, rows in groups:
            k = torch.cat([keys[rows], take_rows(comp_kv, gather[rows, :w], q.dtype)], 1)
            m = torch.cat([mask[rows], real[rows, :w]], 1)
            out[rows] = attend(q[rows], k, m, self.attn_sink, scale)
        return out
