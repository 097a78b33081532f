"""DeepSeek-V4-Flash's cache layout at the seeds' block size, as a fact: what the host's
scheduler sizes against in production, for the tests and benchmarks that need the real
tile without a Flash checkpoint on disk (the layout is what CacheLayout.for_model gives
for Flash's config.json).

    swa   ring  32 tokens a page, window 128 (sliding window 128 >= the CSA reach 2*4)
    c4    full  32 compressed rows a page = 128 tokens (CSA, ratio 4)
    c128  full  1 compressed row a page = 128 tokens (HCA, ratio 128)
"""

from __future__ import annotations

from dspark_loop.contract.cache_layout import CacheLayout

FLASH_BLOCK_SIZE = 32  # the seeds' page size in tokens (--block-size)
FLASH_SLIDING_WINDOW = 128  # config.json sliding_window
FLASH_CSA_RATIO = 4  # the overlapping compressor (compressed sparse attention)
FLASH_HCA_RATIO = 128  # the heavily compressed attention


def flash_layout() -> CacheLayout:
    return CacheLayout.for_shape(
        FLASH_BLOCK_SIZE, FLASH_SLIDING_WINDOW, (FLASH_CSA_RATIO, FLASH_HCA_RATIO), FLASH_CSA_RATIO
    )
