"""The engine's tie rule installed into torch.topk for transformers reference runs: among
equal scores the LOWEST index wins (a stable descending sort), as in the engine."""

from __future__ import annotations

import contextlib


def _stable_topk(x, k, dim=-1, largest=True, sorted=True, *, out=None):
    import torch

    order = torch.sort(x, dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k)
    return torch.return_types.topk((x.gather(dim, order), order))


@contextlib.contextmanager
def lowest_index_ties():
    """torch.topk / Tensor.topk with the engine's tie rule (lowest index wins)."""
    import torch

    saved_fn, saved_method = torch.topk, torch.Tensor.topk
    torch.topk = _stable_topk
    torch.Tensor.topk = lambda self, k, dim=-1, largest=True, sorted=True: _stable_topk(self, k, dim, largest)
    try:
        yield
    finally:
        torch.topk, torch.Tensor.topk = saved_fn, saved_method
