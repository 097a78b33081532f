"""Linear layers as the checkpoint stores them: a float weight (fp32/bf16), or W8A8.

W8A8 (the seeds' converter): int8 weight [out, in] with one fp32 scale per output
channel; activations are quantised per token to int8 at run time (symmetric,
scale = amax/127, amax floored at 1e-4). The int8 x int8 products are accumulated in
fp32 here (exact enough on CPU; an NPU build swaps in its int8 matmul).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

AMAX_FLOOR = 1e-4


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., in] -> (int8 [..., in], fp32 scale [..., 1])."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR) / 127.0
    q = torch.round(xf / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] float -> (int8 [out, in], fp32 scale [out])."""
    wf = w.float()
    scale = wf.abs().amax(dim=-1).clamp_min(AMAX_FLOOR) / 127.0
    q = torch.round(wf / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Linear(nn.Module):
    """y = x @ W.T; no bias anywhere in DeepSeek-V4."""

    def __init__(
        self, in_features: int, out_features: int, dtype: torch.dtype = torch.float32, w8a8: bool = False
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.w8a8 = in_features, out_features, w8a8
        if w8a8:
            self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=torch.int8), requires_grad=False)
            self.scale = nn.Parameter(torch.ones(out_features, dtype=torch.float32), requires_grad=False)
        else:
            self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=dtype), requires_grad=False)
            self.scale = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if not self.w8a8:
            return F.linear(x.to(self.weight.dtype), self.weight)
        xq, xs = quantize_per_token(x)
        y = F.linear(xq.float(), self.weight.float())  # [..., out], int products in fp32
        return (y * xs * self.scale).to(x.dtype if x.dtype != torch.int8 else torch.float32)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}{', w8a8' if self.w8a8 else ''}"
