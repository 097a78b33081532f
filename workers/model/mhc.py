"""mHC (manifold-constrained hyper-connections): hc streams of the residual mixed around
each sublayer.

    hc_pre   h [rows, hc, d] -> post [rows, hc], comb [rows, hc, hc] (Sinkhorn-normalised),
             the collapsed sublayer input [rows, d]
    hc_post  h'[k] = post[k] * sublayer_out + sum_j comb[j, k] * h[j]
    hc_head  the final collapse before the head (no Sinkhorn)

Fast path (fp32, C kernels): torch runs only the reductions and exps (the norm's mean, the
mix projection, one exp over the pre/post arguments, the softmax); the C kernels do the
exact arithmetic in between, op for op as the torch composition (tests/unit/workers/model/
test_kernels.py compares the bits).
"""

from __future__ import annotations

import torch

from workers.model import kernels
from workers.model.layers import matmul_rows, rms_unweighted, sigmoid


def hc_pre(
    h: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    sinkhorn_iters: int,
    hc_eps: float,
    norm_eps: float,
):
    """mHC weights for one sublayer. h [rows, hc, d] -> post [rows, hc], comb [rows, hc, hc]
    (comb[j, k]: stream j into stream k), collapsed input [rows, d]. One pass over all rows:
    only the mix projection is tiled; the Sinkhorn's 4x4 sums are per-row reductions."""
    k = kernels.lib()
    if k is not None and h.shape[1] <= 64 and kernels.fits(h, fn, base, scale):
        return _hc_pre_c(k, h, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps)
    rows, hc = h.shape[0], h.shape[1]
    flat = rms_unweighted(h.flatten(1).float(), norm_eps)  # [rows, hc*d]
    mix = matmul_rows(flat, fn.float())  # [rows, (2+hc)*hc]
    pre_w, post_w, comb_w = mix.split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = base.split([hc, hc, hc * hc])
    pre = sigmoid(pre_w * scale[0] + pre_b) + hc_eps
    post = 2 * sigmoid(post_w * scale[1] + post_b)
    comb = comb_w.reshape(rows, hc, hc) * scale[2] + comb_b.view(hc, hc)
    if comb.requires_grad:  # training (tools/train_demo): the same ops out of place, same bits
        comb = torch.softmax(comb, dim=-1) + hc_eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
        for _ in range(sinkhorn_iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
        return post, comb, weighted_streams(pre, h)  # collapsed [rows, d]
    comb = torch.softmax(comb, dim=-1).add_(hc_eps)
    sinkhorn_(comb, sinkhorn_iters, hc_eps)
    return post, comb, weighted_streams(pre, h)  # collapsed [rows, d]


def _hc_pre_c(
    k, h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int, hc_eps, norm_eps
):
    """hc_pre with the C kernels: h [rows, hc, d] fp32."""
    rows, hc, d = h.shape
    flat = rms_unweighted(h.flatten(1), norm_eps)  # [rows, hc*d]
    mix = matmul_rows(flat, fn)  # [rows, (2+hc)*hc]
    z = mix.new_empty(rows, 2 * hc)  # -(pre, post logits): their sigmoids' exp arguments
    comb = mix.new_empty(rows, hc, hc)
    k.hc_mix(mix.data_ptr(), scale.data_ptr(), base.data_ptr(), z.data_ptr(), comb.data_ptr(), rows, hc)
    e = z.exp_()  # [rows, 2*hc]
    comb = torch.softmax(comb, dim=-1)  # [rows, hc, hc]
    post, y = mix.new_empty(rows, hc), h.new_empty(rows, d)
    k.hc_finish(
        e.data_ptr(), comb.data_ptr(), h.data_ptr(), post.data_ptr(), y.data_ptr(), rows, hc, d, iters - 1, hc_eps
    )
    return post, comb, y


def sinkhorn_(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """In place on comb [rows, hc, hc]: a column normalisation, then iters-1 rounds of
    (rows, columns), each x / (sum + eps)."""
    k = kernels.lib()
    if k is not None and kernels.fits(comb):
        k.sinkhorn(comb.data_ptr(), comb.shape[0], comb.shape[1], iters - 1, eps)
        return comb
    comb.div_(comb.sum(dim=-2, keepdim=True).add_(eps))
    for _ in range(iters - 1):  # in place: the same ops, fewer allocations
        comb.div_(comb.sum(dim=-1, keepdim=True).add_(eps))
        comb.div_(comb.sum(dim=-2, keepdim=True).add_(eps))
    return comb


def weighted_streams(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """sum_k w[:, k] * h[:, k] in h's dtype: w [rows, hc] fp32, h [rows, hc, d] -> [rows, d]."""
    k = kernels.lib()
    if k is not None and kernels.fits(w, h):
        out = h.new_empty(h.shape[0], h.shape[2])
        k.weighted_sum(h.data_ptr(), w.data_ptr(), out.data_ptr(), h.shape[0], h.shape[1], h.shape[2])
        return out
    return (w.unsqueeze(-1) * h).sum(dim=1).to(h.dtype)


def hc_post(h: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """h'[k] = post[k]*out + sum_j comb[j, k]*h[j]. h [rows, hc, d], out [rows, d]."""
    dtype = h.dtype
    k = kernels.lib()
    if k is not None and kernels.fits(h, out, post, comb):
        res = torch.empty_like(h)
        k.hc_post(
            h.data_ptr(),
            out.data_ptr(),
            post.data_ptr(),
            comb.data_ptr(),
            res.data_ptr(),
            h.shape[0],
            h.shape[1],
            h.shape[2],
        )
        return res
    comb = comb.to(dtype)
    # NOTE: elementwise in a fixed order, not a batched matmul over rows (its tail handling
    # depends on the row count, see linear_rows).
    mixed = comb[:, 0, :, None] * h[:, 0:1, :]  # [rows, hc, d]
    for j in range(1, h.shape[1]):
        mixed = mixed + comb[:, j, :, None] * h[:, j : j + 1, :]
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + mixed


def hc_head(
    h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, hc_eps: float, norm_eps: float
) -> torch.Tensor:
    """Final collapse of the streams: h [rows, hc, d] -> [rows, d] (no Sinkhorn)."""
    flat = rms_unweighted(h.flatten(1).float(), norm_eps)
    mix = matmul_rows(flat, fn.float())  # [rows, hc]
    pre = sigmoid(mix * scale.float() + base.float()) + hc_eps
    return weighted_streams(pre, h)
