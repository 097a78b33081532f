"""Schedulers for tests and benches, built by keyword from one set of defaults (never a
row of positional numbers).

    make_scheduler(**overrides)                        the unit tests' tiny shape
    model_scheduler(cfg, block_size, num_blocks, ...)  a checkpoint's layout and EOS ids,
                                                       bench-sized budget, prefix caching off
"""

from __future__ import annotations

from types import SimpleNamespace

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.engine.scheduler import Scheduler
from dspark_testing.tiny_tokenizer import eos_id


def tiny_layout(block_size: int = 4, sliding_window: int = 8, ratios=(4,)) -> CacheLayout:
    """Default: swa pages of 4 tokens (window 8), c4 pages of 4 rows = 16 tokens."""
    cfg = SimpleNamespace(ratios=tuple(ratios), csa_ratio=min(ratios) if ratios else 4, sliding_window=sliding_window)
    return CacheLayout.for_model(cfg, block_size)


def make_scheduler(**overrides) -> Scheduler:
    """The tiny shape (tiny_layout, one partition of 8 seats, a 64-token budget, a 256-token
    context, the tiny tokenizer's EOS, K=0, prefix caching on), any field overridden by name."""
    kw = dict(
        num_partitions=1,
        num_blocks=[32, 16],
        max_num_seqs=8,
        max_num_batched_tokens=64,
        long_prefill_token_threshold=0,
        max_model_len=256,
        spec_k=0,
        enable_prefix_caching=True,
    )
    kw.update(overrides)
    if "layout" not in kw:
        kw["layout"] = tiny_layout()
    if "eos_token_ids" not in kw:
        kw["eos_token_ids"] = [eos_id()]
    return Scheduler(**kw)


def model_scheduler(cfg, block_size: int, num_blocks: list[int], **overrides) -> Scheduler:
    """For a checkpoint's ModelConfig: its cache layout at block_size and its EOS ids, an
    8192-token budget, a 4096-token context, prefix caching off; overrides by name."""
    kw = dict(
        layout=CacheLayout.for_model(cfg, block_size),
        num_blocks=list(num_blocks),
        eos_token_ids=cfg.eos_token_ids,
        max_num_batched_tokens=8192,
        max_model_len=4096,
        enable_prefix_caching=False,
    )
    kw.update(overrides)
    return make_scheduler(**kw)
