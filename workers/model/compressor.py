"""KV compressor: pools the per-token projections of r tokens into one entry.

project(x)   kv, score [rows, coff*d_c]   stored per token in the swa ring
pool(...)    entry j from the state rows of positions
               HCA  (coff 1):  j*r .. j*r+r-1                    full width
               CSA  (coff 2):  (j-1)*r .. j*r-1 (A = [:d_c])  +  j*r .. j*r+r-1 (B = [d_c:])
             per-channel softmax over the slots (score + ape[pos % r]), RMSNorm, then
             rope at the group's first position j*r (done by the caller).
"""

from __future__ import annotations

import torch
from torch import nn

from workers.model.layers import RMSNorm, linear_rows
from workers.model.linear import Linear


class Compressor(nn.Module):
    def __init__(self, hidden: int, dim: int, ratio: int, overlap: bool, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.dim, self.ratio, self.overlap = dim, ratio, overlap
        coff = 2 if overlap else 1
        self.ape = nn.Parameter(torch.zeros(ratio, coff * dim, dtype=torch.float32), requires_grad=False)
        self.wkv = Linear(hidden, coff * dim, dtype)
        self.wgate = Linear(hidden, coff * dim, dtype)
        self.norm = RMSNorm(dim, eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [rows, hidden]
        return linear_rows(self.wkv, x), linear_rows(self.wgate, x)  # 2 x [rows, coff*dim]

    def pool(self, kv: torch.Tensor, score: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """kv, score [E, S, coff*dim] state rows in position order (S = 2r overlapping, else r),
        valid [E, S] (False: an empty slot before position 0) -> entries [E, dim] (normed)."""
        r, d = self.ratio, self.dim
        ape = self.ape.repeat(2, 1) if self.overlap else self.ape  # [S, coff*dim]
        score = score.float() + ape  # [E, S, coff*dim]
        if self.overlap:
            # NOTE: slots 0..r-1 (previous group) contribute their A half, r..2r-1 their B half.
            kv = torch.cat([kv[:, :r, :d], kv[:, r:, d:]], dim=1)  # [E, 2r, d]
            score = torch.cat([score[:, :r, :d], score[:, r:, d:]], dim=1)
        kv = torch.where(valid[..., None], kv, torch.zeros((), dtype=kv.dtype))
        score = score.masked_fill(~valid[..., None], float("-inf"))
        # NOTE: softmax over the slots written out: torch's softmax over a middle dim splits
        # its work by thread count and batch size (a row's bits changed with E at 2 threads);
        # max, exp and sums over dim 1 are per (entry, channel).
        e = torch.exp(score - score.max(dim=1, keepdim=True).values)  # [E, S', d]
        weights = (e / e.sum(dim=1, keepdim=True)).to(kv.dtype)
        return self.norm((kv * weights).sum(dim=1))  # [E, d]
