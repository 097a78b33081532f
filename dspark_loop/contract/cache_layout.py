"""The cache families both sides agree on: the host allocates their pages, the ranks own
the tensors behind them. Torch-free.

    family   kind   page holds                          layers      history
    ------   ----   ----------------------------------  ----------  --------------------
    swa      ring   block_size tokens: raw KV row and   all         the last `window`
                    compressor-state rows per token                 tokens (+ in flight)
    c{r}     full   rows_per_page compressed rows       ratio r     everything
                    (CSA: + indexer keys per row)

`window` = max(sliding_window, the compressor states' reach: 2*r for the overlapping
CSA compressor, r for HCA), so one ring covers both the raw KV a query reads and the
per-token projections a compressor pools at its next boundary. Flash (block 32, window
128, ratios 4/128): swa pages of 32 tokens, c4 pages of 32 rows (128 tokens), c128 pages
of 1 row (128 tokens); prefix hits align to lcm = 128 tokens, as in the seeds.

Block ids are partition-local and shared by every layer of a family (each layer has its
own tensor, indexed by the same ids), so allocation happens once per family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dspark_loop.contract.model_config import ModelConfig


@dataclass(frozen=True)
class Family:
    index: int
    name: str
    ring: bool  # True: only the last `window` tokens are kept; pages behind it are released
    tokens_per_page: int
    ratio: int  # 0 for swa, else the compress ratio
    window: int  # tokens kept by a ring family (0 for full-history families)
    rows_per_page: int = field(init=False, compare=False)  # cache rows a page holds (asked every step)

    def __post_init__(self) -> None:
        rows = self.tokens_per_page // self.ratio if self.ratio else self.tokens_per_page
        object.__setattr__(self, "rows_per_page", rows)

    def num_pages(self, num_tokens: int) -> int:
        """Pages spanning positions [0, num_tokens)."""
        return -(-num_tokens // self.tokens_per_page)

    def first_live_page(self, next_pos: int) -> int:
        """Lowest page a step writing positions >= next_pos may still read (ring families)."""
        if not self.ring:
            return 0
        return max(0, next_pos - self.window + 1) // self.tokens_per_page


@dataclass(frozen=True)
class CacheLayout:
    block_size: int
    families: tuple[Family, ...]

    @property
    def prefix_align(self) -> int:
        """Prefix-cache hits are multiples of this many tokens (128 for Flash)."""
        return math.lcm(*(f.tokens_per_page for f in self.families))

    def family(self, name: str) -> Family:
        for f in self.families:
            if f.name == name:
                return f
        raise KeyError(name)

    @classmethod
    def for_model(cls, cfg: ModelConfig, block_size: int) -> CacheLayout:
        return cls.for_shape(block_size, cfg.sliding_window, cfg.ratios, cfg.csa_ratio)

    @classmethod
    def for_shape(cls, block_size: int, sliding_window: int, ratios: tuple[int, ...], csa_ratio: int) -> CacheLayout:
        """The layout of a model whose layers compress by `ratios` (the distinct non-zero
        ones, ascending), csa_ratio the overlapping compressor's."""
        reach = [2 * r if r == csa_ratio else r for r in ratios]
        window = max([sliding_window, *reach])
        fams = [Family(0, "swa", True, block_size, 0, window)]
        for r in ratios:
            rows = max(1, 4 * block_size // r)
            tokens = rows * r
            if tokens % block_size and block_size % tokens:
                raise ValueError(f"compress ratio {r} does not tile block size {block_size}")
            fams.append(Family(len(fams), f"c{r}", False, tokens, r, 0))
        return cls(block_size, tuple(fams))
