"""How many cache pages a byte budget holds, per family (torch-free: the sim's ranks size
their pools with it too). itemsize: bytes per cached value (4 fp32, 2 bf16)."""

from __future__ import annotations

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig

SCRATCH_ROWS = 512  # unpublished rows per step (64 requests x 8 rows)


def bytes_per_block(cfg: ModelConfig, layout: CacheLayout, itemsize: int) -> list[int]:
    out = []
    for fam in layout.families:
        width = 0
        for layer, r in enumerate(cfg.compress_ratios):
            if fam.ratio == 0:
                width += cfg.head_dim
                if r:
                    width += 2 * (2 if r == cfg.csa_ratio else 1) * cfg.head_dim
                if r and cfg.is_csa(layer):
                    width += 2 * 2 * cfg.index_head_dim
            elif r == fam.ratio:
                width += cfg.head_dim + (cfg.index_head_dim if cfg.is_csa(layer) else 0)
        out.append(width * fam.rows_per_page * itemsize)
    return out


def budget_from_device(free: int, total: int, utilization: float) -> int:
    """Bytes for the KV pools on an accelerator of `total` bytes with `free` left once the
    weights (and the drafter) are loaded: `utilization` of it, less what is in use. What is
    beyond `utilization` stays free for the step's activations."""
    used = total - free
    budget = int(utilization * total) - used
    if budget <= 0:
        gib = 1 << 30
        raise ValueError(
            f"--gpu-memory-utilization {utilization:g}: {used / gib:.1f} of the device's {total / gib:.1f} GiB "
            "are in use once the weights are loaded, which leaves nothing for KV pages; raise it, or give "
            "--kv-cache-memory or --num-blocks"
        )
    return budget


def blocks_for_budget(
    cfg: ModelConfig, layout: CacheLayout, budget_bytes: int, itemsize: int, scratch_rows: int = SCRATCH_ROWS
) -> list[int]:
    """num_blocks per family from a memory budget: every family gets pages for the same
    number of tokens (generous for the swa ring, which only needs the live window)."""
    per_block = bytes_per_block(cfg, layout, itemsize)
    scratch = sum(-(-scratch_rows // f.rows_per_page) * b for f, b in zip(layout.families, per_block))
    per_token = sum(b / f.tokens_per_page for f, b in zip(layout.families, per_block))
    tokens = max(0.0, (budget_bytes - scratch) / per_token)
    blocks = [int(tokens // f.tokens_per_page) for f in layout.families]
    if min(blocks) < 1:
        raise ValueError(
            f"kv cache budget of {budget_bytes} bytes holds no page of some family (bytes per page {per_block})"
        )
    return blocks
