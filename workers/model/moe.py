"""Mixture of experts: sqrt-softplus router (hash-routed in the first layers), clamped
SwiGLU experts, routed experts EP-sharded over the world, shared expert replicated.

EP exchange (gather-then-sum in rank order, never an all_reduce):
    1. gather_world (x, expert ids, weights) of every rank; keep one copy per TP group
       (ranks g*tp hold the group's tokens)
    2. each rank runs its local experts on every group's tokens -> partial [sum T_g, d]
    3. gather_world the partials; each rank sums, in rank order, its own group's slice
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dspark_loop.contract.model_config import ModelConfig
from workers.model import kernels
from workers.model.config import LocalDims
from workers.model.layers import ROW_TILE, cast, linear_rows, matmul_rows, silu, softplus
from workers.model.linear import Linear, quantize_per_token


class Expert(nn.Module):
    def __init__(self, hidden: int, inter: int, limit: float, dtype: torch.dtype, w8a8, prefix: str) -> None:
        super().__init__()
        self.limit = limit
        self.w1 = Linear(hidden, inter, dtype, w8a8(prefix + "w1"))
        self.w2 = Linear(inter, hidden, dtype, w8a8(prefix + "w2"))
        self.w3 = Linear(hidden, inter, dtype, w8a8(prefix + "w3"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [rows, hidden]
        return linear_rows(self.w2, swiglu(linear_rows(self.w1, x), linear_rows(self.w3, x), self.limit))


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(gate clamped above at limit) * (up clamped to +-limit); gate, up [..., inter] are the
    caller's own (fp32: overwritten by the C path, which keeps only the exp in torch)."""
    k = kernels.lib()
    if k is not None and kernels.fits(gate, up) and not gate.requires_grad:
        z = torch.empty_like(gate)
        k.swiglu_pre(gate.data_ptr(), z.data_ptr(), gate.numel(), limit)
        e = z.exp_()
        k.swiglu_post(gate.data_ptr(), e.data_ptr(), up.data_ptr(), up.numel(), limit)
        return up
    gate = gate.clamp(max=limit)
    return silu(gate) * up.clamp(min=-limit, max=limit)


class Gate(nn.Module):
    def __init__(self, cfg: ModelConfig, is_hash: bool) -> None:
        super().__init__()
        self.is_hash, self.topk = is_hash, cfg.num_experts_per_tok
        self.scale = cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.hidden_size), requires_grad=False)
        if is_hash:
            self.register_buffer("tid2eid", torch.zeros(cfg.vocab_size, self.topk, dtype=torch.long))
        else:
            self.bias = nn.Parameter(torch.zeros(cfg.n_routed_experts), requires_grad=False)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, d] -> expert ids [T, k] (long), weights [T, k] fp32."""
        # NOTE: the logits in fixed row tiles (see layers.linear_rows) and an exact softplus:
        # bits must not depend on the batch. The sort and the sums are per row.
        logits = matmul_rows(x.float(), self.weight.float())  # [T, E]
        scores = softplus(logits).sqrt()
        lib = kernels.lib()
        if lib is not None and self.topk <= 64 and kernels.fits(scores) and scores.shape[1] >= self.topk:
            rows, num_experts = scores.shape
            if self.is_hash:
                idx = self.tid2eid.index_select(0, token_ids).long()  # [T, k]
            else:
                idx = torch.empty(rows, self.topk, dtype=torch.long, device=scores.device)
            w = scores.new_empty(rows, self.topk)  # the stable top-k of scores + bias and the gather in C
            bias = None if self.is_hash else self.bias.float()  # held: its pointer goes to C
            bias_ptr = None if bias is None else bias.data_ptr()
            lib.route_topk(scores.data_ptr(), bias_ptr, idx.data_ptr(), w.data_ptr(), rows, num_experts, self.topk)
            return idx, w / (w.sum(dim=-1, keepdim=True) + 1e-20) * self.scale
        if self.is_hash:
            idx = self.tid2eid[token_ids].long()
        else:
            # NOTE: lowest expert id wins a tie (stable sort), whatever the batch shape.
            idx = torch.sort(scores + self.bias.float(), dim=-1, descending=True, stable=True).indices[:, : self.topk]
        w = scores.gather(1, idx)
        return idx, w / (w.sum(dim=-1, keepdim=True) + 1e-20) * self.scale


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dims: LocalDims, dtype: torch.dtype, w8a8) -> None:
        super().__init__()
        p = f"layers.{layer}.ffn."
        self.gate = Gate(cfg, cfg.is_hash_layer(layer))
        self.expert_lo, self.expert_hi = dims.expert_lo, dims.expert_hi
        inter, limit = cfg.moe_intermediate_size, cfg.swiglu_limit
        self.experts = nn.ModuleDict(
            {
                str(e): Expert(cfg.hidden_size, inter, limit, dtype, w8a8, f"{p}experts.{e}.")
                for e in range(dims.expert_lo, dims.expert_hi)
            }
        )
        self.shared_experts = Expert(
            cfg.hidden_size, inter * cfg.n_shared_experts, limit, dtype, w8a8, p + "shared_experts."
        )
        self.limit = limit
        self._stack_key: tuple | None = None
        self._linears: list[list[Linear]] | None = None
        self._stack: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def stacked_weights(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(weight [E_local, out, in], W8A8 scale [E_local, out] or None) for w1, w3, w2.

        NOTE: each expert's Linear is re-pointed at its slice of the stack, so the weights
        stay in memory once; a replaced weight (load_state_dict(assign=True), .to())
        changes a data pointer and rebuilds the stack."""
        lins = self._linears
        if lins is None:  # the Linear modules never change; their weights may
            lins = self._linears = [[getattr(e, n) for e in self.experts.values()] for n in ("w1", "w3", "w2")]
        key = tuple(lin._parameters["weight"].data_ptr() for group in lins for lin in group)
        if key != self._stack_key:
            self._stack = []
            for group in lins:
                weight = torch.stack([lin.weight.data for lin in group])
                scale = torch.stack([lin.scale.data for lin in group]) if group[0].w8a8 else None
                for i, lin in enumerate(group):
                    lin.weight.data = weight[i]
                    if scale is not None:
                        lin.scale.data = scale[i]
                self._stack.append((weight, scale))
            self._stack_key = tuple(lin.weight.data_ptr() for group in lins for lin in group)
        return self._stack

    def _experts_tiled(self, tiles: torch.Tensor, tile_expert: torch.Tensor) -> torch.Tensor:
        """Every local expert at once: tiles [n, ROW_TILE, d], tile_expert [n] (local index) ->
        [n, ROW_TILE, d]; the Expert arithmetic, one bmm per projection."""
        (w1, s1), (w3, s3), (w2, s2) = self.stacked_weights()
        gate, up = _tile_linear(tiles, w1, s1, tile_expert), _tile_linear(tiles, w3, s3, tile_expert)
        return _tile_linear(swiglu(gate, up, self.limit), w2, s2, tile_expert)

    def routed(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """This rank's experts' share of the routed sum: x [T, d], idx/w [T, k] -> [T, d].

        Assignments (token, slot) are grouped by expert with one stable sort and laid out in
        8-row tiles, each expert's group padded to whole tiles, so every tile has ONE expert
        (the bits of that expert's own 8-row gemm):

            expert 0: a a a a a 0 0 0 | expert 3: a a a a a a a a | a a 0 0 0 0 0 0 | ...

        Each token then sums its k outputs in ascending expert id (slots of other ranks'
        experts add zero): a fixed order per row."""
        lib = kernels.lib()
        if lib is not None and idx.shape[1] <= 64 and idx.dtype == torch.long and kernels.fits(x, w):
            return self._routed_c(lib, x, idx, w)
        rows, k = idx.shape
        d, lo, hi = x.shape[1], self.expert_lo, self.expert_hi
        # NOTE: the index arithmetic (small integer arrays) runs in numpy: a stable sort is
        # one permutation whichever library computes it, and numpy's per-call cost on a few
        # dozen ids is a fraction of torch's.
        flat = idx.cpu().numpy().reshape(-1)  # [T*k]
        all_counts = np.bincount(flat, minlength=hi)
        counts, first = all_counts[lo:hi], int(all_counts[:lo].sum())  # per local expert; skipped
        num_local = int(counts.sum())
        y = x.new_zeros(rows * k, d)  # [T*k, d] per assignment
        if num_local:
            order = np.argsort(flat, kind="stable")  # assignments by expert, tokens ascending
            a = order[first : first + num_local]  # [n] local assignments, by expert
            num_tiles = -(-counts // ROW_TILE)  # [E_local]
            group_start = np.cumsum(counts) - counts  # [E_local] in a
            tile_start = (np.cumsum(num_tiles) - num_tiles) * ROW_TILE  # [E_local] in tiles
            e = flat[a] - lo  # [n]
            pos = torch.from_numpy(np.arange(num_local) - group_start[e] + tile_start[e]).to(x.device)  # [n]
            a_t = torch.from_numpy(a).to(x.device)
            tiles = x.new_zeros(int(num_tiles.sum()) * ROW_TILE, d)
            tiles[pos] = x[a_t // k]
            tile_expert = torch.from_numpy(np.repeat(np.arange(len(counts)), num_tiles)).to(x.device)
            y[a_t] = self._experts_tiled(tiles.view(-1, ROW_TILE, d), tile_expert).view(-1, d)[pos]
        y = (y * w.flatten()[:, None].to(x.dtype)).view(rows, k, d)  # [T, k, d]
        by_id = np.argsort(flat.reshape(rows, k), axis=1, kind="stable")  # [T, k] slots by expert id
        by_id = torch.from_numpy(by_id).to(x.device)
        out = torch.zeros_like(x)
        for j in range(k):
            out = out + y.gather(1, by_id[:, j, None, None].expand(-1, 1, d)).squeeze(1)
        return out

    def _routed_c(self, lib, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """routed() with the tile plan, the row gather and the ordered combine in C (fp32 x, w);
        the same tiles through the same expert bmms, so the same bits."""
        rows, k = idx.shape
        d, lo, hi = x.shape[1], self.expert_lo, self.expert_hi
        flat = idx.reshape(-1).contiguous()  # [T*k] expert ids (int64)
        num = flat.shape[0]
        cap = num // ROW_TILE + (hi - lo)  # >= sum over experts of ceil(count / 8)
        ints = torch.empty(hi - lo + num + cap * (ROW_TILE + 1), dtype=torch.long, device=x.device)
        counts, pos, tile_src, tile_expert = ints.split([hi - lo, num, cap * ROW_TILE, cap])
        num_tiles = lib.moe_plan(
            flat.data_ptr(),
            num,
            k,
            lo,
            hi,
            counts.data_ptr(),
            pos.data_ptr(),
            tile_src.data_ptr(),
            tile_expert.data_ptr(),
        )
        yt = x  # [tiles*8, d] expert outputs per tile row (unread when no tile)
        if num_tiles:
            tiles = x.new_empty(num_tiles * ROW_TILE, d)
            lib.gather_rows(x.data_ptr(), tile_src.data_ptr(), tiles.data_ptr(), num_tiles * ROW_TILE, d)
            yt = self._experts_tiled(tiles.view(-1, ROW_TILE, d), tile_expert[:num_tiles]).contiguous()
        out = torch.empty_like(x)  # [T, d]
        lib.moe_combine(yt.data_ptr(), pos.data_ptr(), w.data_ptr(), flat.data_ptr(), out.data_ptr(), rows, k, d)
        return out

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor, comm) -> torch.Tensor:  # [T, d]
        idx, w = self.gate(x, token_ids)
        shard = comm.shard
        if shard.world_size == 1:
            routed = self.routed(x, idx, w)
        else:
            tp = shard.tp_size
            xs = comm.gather_world(x)[::tp]  # one copy per TP group
            idxs = comm.gather_world(idx)[::tp]
            ws = comm.gather_world(w)[::tp]
            partial = torch.cat([self.routed(a, b, c) for a, b, c in zip(xs, idxs, ws)])  # [sum T_g, d]
            start = sum(t.shape[0] for t in xs[: shard.group])
            parts = [p[start : start + x.shape[0]] for p in comm.gather_world(partial)]
            routed = parts[0]
            for p in parts[1:]:
                routed = routed + p
        return routed + self.shared_experts(x)


def _tile_linear(
    tiles: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, tile_expert: torch.Tensor
) -> torch.Tensor:
    """Linear.forward per tile with its expert's weight: tiles [n, 8, in], weight [E, out, in]
    -> [n, 8, out] (one bmm: each tile gets its own 8-row gemm's bits, see layers)."""
    if scale is None and (tiles.requires_grad or weight.requires_grad):
        return _TileLinear.apply(tiles, weight, tile_expert)  # training: same forward bits
    w = weight.index_select(0, tile_expert)  # [n, out, in] (one copy, as weight[tile_expert])
    if scale is None:
        return torch.bmm(cast(tiles, weight.dtype), w.transpose(1, 2))
    xq, xs = quantize_per_token(tiles)  # [n, 8, in] int8, [n, 8, 1]
    y = torch.bmm(xq.float(), w.float().transpose(1, 2))  # int products in fp32
    return (y * xs * scale.index_select(0, tile_expert)[:, None, :]).to(tiles.dtype)


class _TileLinear(torch.autograd.Function):
    """_tile_linear with autograd (tools/train_demo): the serving forward; a backward that
    neither keeps the gathered [n, out, in] weights nor scatters per-tile weight gradients
    (one GEMM per expert instead)."""

    @staticmethod
    def forward(ctx, tiles: torch.Tensor, weight: torch.Tensor, tile_expert: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(tiles, weight, tile_expert)
        return torch.bmm(tiles.to(weight.dtype), weight[tile_expert].transpose(1, 2))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # grad [n, 8, out]
        tiles, weight, tile_expert = ctx.saved_tensors
        gt = gw = None
        if ctx.needs_input_grad[0]:
            gt = torch.empty_like(tiles)
        if ctx.needs_input_grad[1]:
            gw = torch.zeros_like(weight)
        for e in tile_expert.unique().tolist():
            sel = (tile_expert == e).nonzero().squeeze(1)
            g = grad[sel].reshape(-1, grad.shape[-1])  # [m*8, out]
            if gt is not None:
                gt[sel] = (g @ weight[e].to(g.dtype)).view(-1, tiles.shape[1], tiles.shape[2]).to(tiles.dtype)
            if gw is not None:
                gw[e] = (g.t() @ tiles[sel].reshape(-1, tiles.shape[-1]).to(g.dtype)).to(weight.dtype)
        return gt, gw, None
