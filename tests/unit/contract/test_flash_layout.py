"""The production cache layout (DeepSeek-V4-Flash at block 32) is a shared fact of the contract."""

from __future__ import annotations

from dspark_loop.contract.cache_layout import CacheLayout, Family
from dspark_loop.contract.flash_layout import flash_layout


def test_flash_pages_hold_32_128_and_128_tokens_and_prefix_hits_align_to_128():
    """swa: a ring of 32-token pages over a 128-token window; c4 and c128: full history, 128 tokens a page."""
    assert flash_layout() == CacheLayout(
        32,
        (Family(0, "swa", True, 32, 0, 128), Family(1, "c4", False, 128, 4, 0), Family(2, "c128", False, 128, 128, 0)),
    )
    assert [f.rows_per_page for f in flash_layout().families] == [32, 32, 1]
    assert flash_layout().prefix_align == 128
