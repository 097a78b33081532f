"""The physical cache tensors of one rank, per cache family of CacheLayout (see there).

    swa ring (page = block_size tokens)       slot = block*block_size + offset
      raw_kv[L]          [slots, head_dim]        every layer: kv after norm + rope
      state_kv/score[L]  [slots, coff*head_dim]   compressed layers: per-token compressor
                                                  projections (score without ape)
      index_state_*[L]   [slots, 2*index_dim]     CSA layers: the indexer compressor's
    c{r} (page = rows_per_page compressed rows) row j at table[j//rpp]*rpp + j%rpp
      comp_kv[L]         [rows, head_dim]         ratio-r layers: entry after norm + rope
      index_keys[L]      [rows, index_dim]        CSA layers: indexer key (+ Hadamard)

Past num_blocks every family keeps scratch pages: rows computed in a step but not
published (a verify tile's drafts under a commit mask) are written there, so the real
pages never change. Scratch is reused every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark_loop.contract.cache_layout import CacheLayout, Family
from dspark_loop.contract.model_config import ModelConfig
from workers import kv_budget
from workers.kv_budget import SCRATCH_ROWS  # re-exported: runner, tests


def page_rows(fam: Family) -> int:
    return fam.rows_per_page


def bytes_per_block(cfg: ModelConfig, layout: CacheLayout, dtype: torch.dtype) -> list[int]:
    return kv_budget.bytes_per_block(cfg, layout, torch.empty(0, dtype=dtype).element_size())


def blocks_for_budget(
    cfg: ModelConfig, layout: CacheLayout, budget_bytes: int, dtype: torch.dtype, scratch_rows: int = SCRATCH_ROWS
) -> list[int]:
    """kv_budget.blocks_for_budget at dtype's item size."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return kv_budget.blocks_for_budget(cfg, layout, budget_bytes, itemsize, scratch_rows)


@dataclass
class FamilyTensors:
    num_blocks: int
    scratch_base: int  # first scratch slot (row) of this family
    scratch_rows: int


class KVPool:
    def __init__(
        self,
        cfg: ModelConfig,
        layout: CacheLayout,
        num_blocks: list[int],
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        scratch_rows: int = SCRATCH_ROWS,
    ) -> None:
        if len(num_blocks) != len(layout.families):
            raise ValueError(f"num_blocks has {len(num_blocks)} entries for {len(layout.families)} cache families")
        self.cfg, self.layout, self.dtype = cfg, layout, dtype
        self.families: list[FamilyTensors] = []
        slots = []
        for fam, n in zip(layout.families, num_blocks):
            rows = page_rows(fam)
            scratch_pages = -(-scratch_rows // rows)
            self.families.append(FamilyTensors(n, n * rows, scratch_pages * rows))
            slots.append((n + scratch_pages) * rows)

        def zeros(fam: int, width: int) -> torch.Tensor:
            return torch.zeros(slots[fam], width, dtype=dtype, device=device)

        fam_of_ratio = {f.ratio: f.index for f in layout.families if f.ratio}
        self.raw_kv: dict[int, torch.Tensor] = {}
        self.state_kv: dict[int, torch.Tensor] = {}
        self.state_score: dict[int, torch.Tensor] = {}
        self.index_state_kv: dict[int, torch.Tensor] = {}
        self.index_state_score: dict[int, torch.Tensor] = {}
        self.comp_kv: dict[int, torch.Tensor] = {}
        self.index_keys: dict[int, torch.Tensor] = {}
        for layer, r in enumerate(cfg.compress_ratios):
            self.raw_kv[layer] = zeros(0, cfg.head_dim)
            if not r:
                continue
            coff = 2 if cfg.is_csa(layer) else 1
            self.state_kv[layer] = zeros(0, coff * cfg.head_dim)
            self.state_score[layer] = zeros(0, coff * cfg.head_dim)
            self.comp_kv[layer] = zeros(fam_of_ratio[r], cfg.head_dim)
            if cfg.is_csa(layer):
                self.index_state_kv[layer] = zeros(0, 2 * cfg.index_head_dim)
                self.index_state_score[layer] = zeros(0, 2 * cfg.index_head_dim)
                self.index_keys[layer] = zeros(fam_of_ratio[r], cfg.index_head_dim)

    @property
    def num_blocks(self) -> list[int]:
        return [f.num_blocks for f in self.families]

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every cache tensor by a stable name (tests compare whole caches)."""
        out = {}
        for name in (
            "raw_kv",
            "state_kv",
            "state_score",
            "index_state_kv",
            "index_state_score",
            "comp_kv",
            "index_keys",
        ):
            for layer, t in getattr(self, name).items():
                out[f"{name}.{layer}"] = t
        return out
