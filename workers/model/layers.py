"""Small building blocks: row-invariant projections, RMSNorm, interleaved rope, the
Walsh-Hadamard rotation (the mHC stream mixing is mhc.py). Norms, hc and softmaxes run in
fp32 as transformers does.

Row invariance (a row's bits never depend on the batch) rests on three measured rules:
  - GEMMs: a BLAS gemm picks its kernel by the row count, so every projection runs on
    fixed ROW_TILE-row tiles; all tiles go through ONE torch.bmm ([tiles, 8, in] x [in, out]),
    which gives each tile the bits of its own 8-row gemm whatever the number of tiles.
  - reductions over a row's own elements (sum/mean/amax over the last dim, sums over a
    middle dim, last-dim softmax, per-row einsum) are row-invariant: run on all rows at once.
  - elementwise ops: exact ones (+ - * / sqrt exp log1p) are; sigmoid, silu, softplus and
    rsqrt are NOT (the vector kernel and the scalar tail differ in the last bit, and which
    elements land in the tail depends on the tensor size), so they are composed here from
    exact ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workers.model import kernels
from workers.model.linear import Linear, quantize_per_token

ROW_TILE = 8


def matmul_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [rows, ..., in] @ weight [out, in].T -> [rows, ..., out]; the flattened rows go in
    fixed ROW_TILE-row tiles (zero-padded) through one batched matmul.

        rows 0..7 | 8..15 | ... | n-1, 0-pad    ->  bmm([tiles, 8, in], [tiles, in, out] (expanded))
    """
    if x.requires_grad or weight.requires_grad:
        return _TiledMatmul.apply(x, weight)  # training: the same forward, a plain-GEMM backward
    return _matmul_tiles(x, weight)


def _matmul_tiles(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # NOTE: written for few torch calls (each costs ~1 us; ~90 of these run per tiny step):
    # no reshape of a 2-D x, and a single tile as one F.linear (a plain 8-row gemm, 2 us less
    # than a 1-batch bmm). Measured: bmm gives each tile exactly the 8-row F.linear's bits
    # except where bmm takes its own naive loop (8*in*out < 400) or out == 1 (gemv), which
    # the guard leaves on bmm; tests/unit/workers/model/test_row_invariance.py holds it.
    shape = x.shape
    k, n_out = shape[-1], weight.shape[0]
    flat = x if len(shape) == 2 else x.reshape(-1, k)  # [n, in]
    n = flat.shape[0]
    pad = (-n) % ROW_TILE
    if pad:
        flat = torch.constant_pad_nd(flat, (0, 0, 0, pad))  # zero rows
    num_tiles = (n + pad) // ROW_TILE
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    if num_tiles == 1 and n_out >= 4 and k * n_out >= 64:
        y = F.linear(flat, weight)[:n]  # [n, out]: one 8-row gemm, the bits of bmm's tile (see below)
    else:
        w = weight.t().expand(num_tiles, k, n_out)  # [tiles, in, out]
        y = torch.bmm(flat.view(num_tiles, ROW_TILE, k), w)  # [tiles, 8, out]
        y = y[0, :n] if num_tiles == 1 else y.view(-1, n_out)[:n]  # [n, out]
    return y if len(shape) == 2 else y.view(*shape[:-1], n_out)


def matmul_groups(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """matmul_rows per group in one bmm: x [rows, G, in] @ weight [G, out, in] -> [rows, G, out].

        group 0: rows 0..7 | 8..15 | ... | group 1: rows 0..7 | ...  -> bmm([G*tiles, 8, in], ...)
    Each (group, tile) is its own 8-row gemm with the same weight layout as matmul_rows."""
    rows, groups, k = x.shape
    pad = (-rows) % ROW_TILE
    xg = x.transpose(0, 1)  # [G, rows, in]
    if pad:
        xg = torch.constant_pad_nd(xg, (0, 0, 0, pad))
    num_tiles = (rows + pad) // ROW_TILE
    tiles = xg.reshape(groups * num_tiles, ROW_TILE, k)  # [G*tiles, 8, in]
    w = cast(weight, x.dtype)
    w = (w if num_tiles == 1 else w.repeat_interleave(num_tiles, dim=0)).transpose(1, 2)  # [G*tiles, in, out]
    y = torch.bmm(tiles, w).view(groups, num_tiles * ROW_TILE, weight.shape[1])  # [G, tiles*8, out]
    return y[:, :rows].transpose(0, 1)  # [rows, G, out]


class _TiledMatmul(torch.autograd.Function):
    """matmul_rows with autograd (tools/train_demo): the forward is the serving tiles' bits;
    the backward is two plain GEMMs (autograd through the expanded weight would build a
    [tiles, in, out] gradient and sum it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return _matmul_tiles(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        k, n_out = x.shape[-1], weight.shape[0]
        g = grad.reshape(-1, n_out)  # [n, out]
        gx = (g @ weight.to(g.dtype)).to(x.dtype).view(x.shape) if ctx.needs_input_grad[0] else None
        gw = (g.t() @ x.reshape(-1, k).to(g.dtype)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return gx, gw


def linear_rows(lin, x: torch.Tensor) -> torch.Tensor:
    """lin(x) for x [rows, ..., in] (a Linear, or any row-wise callable), in fixed tiles of
    ROW_TILE rows.

    NOTE: a BLAS gemm picks its kernel and tail handling by the number of rows, so a row's
    result changes with its neighbours' count (measured on CPU). Calling it on fixed-size
    tiles makes every row's bits independent of the
    batch: a request gives the same tokens alone or packed, and a verify tile writes the
    same cache rows as a 1-row step.
    """
    if not isinstance(lin, Linear):
        return row_tiles(lin, x)
    if not lin.w8a8:
        return matmul_rows(x if x.dtype == lin.weight.dtype else x.to(lin.weight.dtype), lin.weight)
    # the same arithmetic as Linear.forward (per-token quantisation is a per-row amax: exact)
    xq, xs = quantize_per_token(x)
    y = matmul_rows(xq.float(), lin.weight.float())  # int products in fp32
    return (y * xs * lin.scale).to(x.dtype if x.dtype != torch.int8 else torch.float32)


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype; t itself when it already is (a no-op .to() still costs ~1 us a call)."""
    return t if t.dtype == dtype else t.to(dtype)


def take_rows(t: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """t[idx] (rows of t [N, ...] by an index tensor idx [...]) as one index_select, optionally
    cast to dtype: the same copy as advanced indexing at a fraction of its per-call cost
    (measured: [32, 16] row ids 15 -> 5 us)."""
    out = t.index_select(0, idx.reshape(-1)).view(*idx.shape, *t.shape[1:])  # [..., *t.shape[1:]]
    return out if dtype is None else cast(out, dtype)


def row_tiles(fn, *xs: torch.Tensor) -> torch.Tensor:
    """fn(*tile) over fixed ROW_TILE-row tiles of row-aligned tensors xs (zero-padded)."""
    rows = xs[0].shape[0]
    if rows == 0:
        return fn(*xs)
    pad = (-rows) % ROW_TILE
    if pad:
        xs = tuple(torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) for x in xs)
    out = [fn(*(x[i : i + ROW_TILE] for x in xs)) for i in range(0, rows + pad, ROW_TILE)]
    if isinstance(out[0], tuple):
        return tuple(torch.cat(parts)[:rows] for parts in zip(*out))
    return torch.cat(out)[:rows]


# NOTE: exact compositions of the four tail-sensitive pointwise ops (see the module doc):
# on this CPU torch.sigmoid/silu/softplus/rsqrt give a different last bit in the scalar tail
# of a vector loop, so a row's bits would follow the batch's total element count.
def sigmoid(x: torch.Tensor) -> torch.Tensor:  # 1 / (1 + e^-x)
    return torch.reciprocal(torch.exp(-x) + 1.0)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x), linear above 20 as F.softplus."""
    return torch.where(x > 20, x, torch.log1p(torch.exp(x.clamp(max=20))))


def rsqrt(x: torch.Tensor) -> torch.Tensor:  # 1 / sqrt(x)
    return torch.reciprocal(torch.sqrt(x))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [rows, ..., dim]
        xf = x.float()
        if xf.requires_grad:  # training: out of place for autograd, the same ops and bits
            xf = xf * rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (self.weight * xf).to(x.dtype)
        y = xf * _inv_rms_(xf.pow(2).mean(-1, keepdim=True), self.eps)  # [rows, ..., dim]
        y = y.mul_(self.weight)  # weight * y, commuted
        return y if x.dtype == torch.float32 else y.to(x.dtype)


def rms_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:  # [..., dim]
    ms = x.float().square().mean(-1, keepdim=True)  # [..., 1]
    if ms.requires_grad:
        return x * rsqrt(ms + eps).to(x.dtype)
    inv = _inv_rms_(ms, eps)
    return x * (inv if x.dtype == torch.float32 else inv.to(x.dtype))


def _inv_rms_(ms: torch.Tensor, eps: float) -> torch.Tensor:
    """rsqrt(ms + eps) in place on the caller's own ms (fewer allocations, same ops)."""
    return ms.add_(eps).sqrt_().reciprocal_()


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """positions [n] -> cos, sin [n, rope_dim/2] (computed in fp32, stored in dtype)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved rope on the LAST 2*cos.shape[-1] channels: pairs (x0, x1) of consecutive
    channels rotate together. x [n, ..., dim], cos/sin [n, rope_dim/2]; pass -sin to undo."""
    k = kernels.lib()
    if k is not None and x.dim() >= 2 and kernels.fits(x, cos, sin):
        out = torch.empty_like(x)
        n, half, dim = x.shape[0], cos.shape[-1], x.shape[-1]
        k.rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), n, x.numel() // max(n * dim, 1), dim, half)
        return out
    extra = x.dim() - 2
    rd = 2 * cos.shape[-1]
    cos = cos.repeat_interleave(2, dim=-1).view(cos.shape[0], *([1] * extra), rd)  # [n, 1.., rd]
    sin = sin.repeat_interleave(2, dim=-1).view(sin.shape[0], *([1] * extra), rd)
    nope, rope = x[..., :-rd], x[..., -rd:]
    rotated = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    out = rope.float() * cos + rotated.float() * sin
    return torch.cat([nope, out.to(x.dtype)], dim=-1)


def hadamard_matrix(dim: int) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard matrix [dim, dim] (Sylvester; dim a power of two)."""
    if dim & (dim - 1):
        raise ValueError(f"the indexer Hadamard needs a power-of-two index_head_dim, got {dim}")
    m = torch.ones(1, 1)
    while m.shape[0] < dim:
        m = torch.cat([torch.cat([m, m], 1), torch.cat([m, -m], 1)], 0)
    return m / dim**0.5
