"""Turns a step's segments into the index tensors of one packed forward (numpy, vectorised
per segment; no per-token Python loop).

A segment is one request's consecutive rows:

    rows      start_pos ............................ start_pos+n-1
    publish   |<----- n_publish ----->|<-- scratch -->|
    logits    any subset of the rows (a finishing prefill: the last; decode: all)

Rows past n_publish are the verify tile's rejected drafts: their writes (raw kv, compressor
states, compressed entries whose boundary row is unpublished) go to scratch slots, so the
real pages never change, yet rows of the same segment still see them causally.

Slots: swa (ring, page = block_size tokens)  pos p   -> table[p // bs]*bs + p % bs
       c{r} (page = rpp compressed rows)      entry j -> table[j // rpp]*rpp + j % rpp
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dspark_loop.cache_layout import CacheLayout
from dspark_loop.model_config import ModelConfig
from dspark_loop.protocol import BlockUpdate, as_i32
from workers.kv_pool import KVPool

KEY_BUCKET = 16  # compressed-key widths are padded to multiples of this (per row)


@dataclass
class Segment:
    req_id: int
    start_pos: int
    token_ids: np.ndarray  # int32 [n]
    n_publish: int
    logit_rows: np.ndarray  # int [m] row offsets inside the segment


class BlockTables:
    """Per-request page tables, one growable int32 array per cache family (-1 = unmapped)."""

    def __init__(self, num_families: int) -> None:
        self.num_families = num_families
        self.tables: dict[int, list[np.ndarray]] = {}

    def apply(self, update: BlockUpdate) -> None:
        ids = as_i32(update.block_ids)
        per_fam = self.tables.setdefault(
            update.req_id, [np.full(0, -1, np.int32) for _ in range(self.num_families)])
        t = per_fam[update.family]
        end = update.first_page + len(ids)
        if end > len(t):
            t = np.concatenate([t, np.full(max(end - len(t), len(t)), -1, np.int32)])
            per_fam[update.family] = t
        t[update.first_page:end] = ids

    def free(self, req_ids) -> None:
        for r in req_ids:
            self.tables.pop(r, None)

    def get(self, req_id: int, family: int) -> np.ndarray:
        try:
            return self.tables[req_id][family]
        except KeyError:
            raise KeyError(f"request {req_id} has no block table") from None


@dataclass
class RatioIndex:
    """One compress ratio's indices for the step."""
    emit_rows: torch.Tensor  # [E] rows at a boundary ((p+1) % r == 0)
    emit_pos: torch.Tensor  # [E] first token position of the emitted entry (j*r): its rope
    state_slots: torch.Tensor  # [E, S] swa slots of the pooled state rows (S = 2r CSA, r HCA), -1 empty
    write_slots: torch.Tensor  # [E] c{r} slot of the emitted entry
    key_slots: torch.Tensor  # [T, N] c{r} slots of entries j < (p+1)//r, -1 past it
    num_visible: torch.Tensor  # [T]


@dataclass
class StagedBatch:
    token_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    write_slots: torch.Tensor  # [T] swa slot of each row's own raw kv / state rows
    raw_slots: torch.Tensor  # [T, W] swa slots of positions p-W+1 .. p, -1 before 0
    logit_rows: torch.Tensor  # [L] rows whose logits are wanted, in segment order
    ratios: dict[int, RatioIndex] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.token_ids.shape[0])


class _SegmentSlots:
    """Slot lookups for one segment (vectorised over any array of positions / entries)."""

    def __init__(self, seg: Segment, tables: BlockTables, layout: CacheLayout,
                 swa_scratch: int, comp_scratch: dict[int, int]) -> None:
        self.seg, self.tables, self.layout = seg, tables, layout
        self.pub_end = seg.start_pos + seg.n_publish
        self.swa_scratch, self.comp_scratch = swa_scratch, comp_scratch

    def _lookup(self, family: int, page: np.ndarray, what: str) -> np.ndarray:
        table = self.tables.get(self.seg.req_id, family)
        ok = page < len(table)
        blocks = np.where(ok, table[np.minimum(page, max(len(table) - 1, 0))] if len(table) else -1, -1)
        if (blocks < 0).any():
            missing = sorted(set(page[blocks < 0].tolist()))
            raise ValueError(f"request {self.seg.req_id}: family {self.layout.families[family].name} "
                             f"has no block for page(s) {missing[:8]} ({what})")
        return blocks.astype(np.int64)

    def swa(self, pos: np.ndarray) -> np.ndarray:
        """Slots of positions pos (all >= 0 and already written or written this step)."""
        bs = self.layout.block_size
        pub = pos < self.pub_end
        out = np.empty(pos.shape, np.int64)
        if pub.any():
            p = pos[pub]
            out[pub] = self._lookup(0, p // bs, "raw kv") * bs + p % bs
        out[~pub] = self.swa_scratch + (pos[~pub] - self.pub_end)
        return out

    def comp(self, fam_index: int, r: int, j: np.ndarray) -> np.ndarray:
        rpp = self.layout.families[fam_index].rows_per_page
        first_unpub = (self.pub_end + r) // r - 1  # entries whose boundary row is unpublished
        pub = j < first_unpub
        out = np.empty(j.shape, np.int64)
        if pub.any():
            jj = j[pub]
            out[pub] = self._lookup(fam_index, jj // rpp, f"c{r} entries") * rpp + jj % rpp
        out[~pub] = self.comp_scratch[r] + (j[~pub] - first_unpub)
        return out


def bucket(n: np.ndarray | int) -> np.ndarray | int:
    return -(-n // KEY_BUCKET) * KEY_BUCKET


def stage(segments: list[Segment], tables: BlockTables, layout: CacheLayout, cfg: ModelConfig,
          pool: KVPool, device: str | torch.device = "cpu") -> StagedBatch:
    window = cfg.sliding_window
    comp_fams = {f.ratio: f for f in layout.families if f.ratio}
    swa_next = pool.families[0].scratch_base
    swa_end = swa_next + pool.families[0].scratch_rows
    comp_next = {r: pool.families[f.index].scratch_base for r, f in comp_fams.items()}

    tok, pos_all, write, raw, logit = [], [], [], [], []
    per_ratio: dict[int, dict[str, list]] = {r: {k: [] for k in ("emit_rows", "emit_pos", "state",
                                                                 "write", "keys", "vis")}
                                             for r in comp_fams}
    base = 0
    seg_slots = []
    for seg in segments:
        n = len(seg.token_ids)
        if not 0 <= seg.n_publish <= n:
            raise ValueError(f"request {seg.req_id}: n_publish {seg.n_publish} outside [0, {n}]")
        unpub = n - seg.n_publish
        if swa_next + unpub > swa_end:
            raise ValueError(f"more than {pool.families[0].scratch_rows} unpublished rows in one step")
        s = _SegmentSlots(seg, tables, layout, swa_next, dict(comp_next))
        swa_next += unpub
        for r in comp_fams:
            first_unpub = (s.pub_end + r) // r - 1
            comp_next[r] += max(0, (seg.start_pos + n) // r - first_unpub)
        pos = seg.start_pos + np.arange(n, dtype=np.int64)  # [n]
        tok.append(np.asarray(seg.token_ids, np.int64))
        pos_all.append(pos)
        write.append(s.swa(pos))
        q = pos[:, None] - np.arange(window - 1, -1, -1)[None, :]  # [n, W] oldest first
        slots = np.full(q.shape, -1, np.int64)
        slots[q >= 0] = s.swa(q[q >= 0])
        raw.append(slots)
        logit.append(base + np.asarray(seg.logit_rows, np.int64))
        seg_slots.append((s, pos, base))
        base += n

    for r, fam in comp_fams.items():
        fam_slots = pool.families[fam.index]
        if comp_next[r] > fam_slots.scratch_base + fam_slots.scratch_rows:
            raise ValueError(f"more than {fam_slots.scratch_rows} unpublished c{r} entries in one step")
    width = {r: int(bucket(max(((sp[1][-1] + 1) // r for sp in seg_slots if len(sp[1])), default=0)))
             for r in comp_fams}
    for s, pos, row0 in seg_slots:
        for r, fam in comp_fams.items():
            acc = per_ratio[r]
            vis = (pos + 1) // r  # [n]
            j = np.broadcast_to(np.arange(width[r])[None, :], (len(pos), width[r]))  # [n, N]
            keys = np.full(j.shape, -1, np.int64)
            m = j < vis[:, None]
            keys[m] = s.comp(fam.index, r, j[m])
            acc["keys"].append(keys)
            acc["vis"].append(vis)
            at = np.nonzero((pos + 1) % r == 0)[0]  # boundary rows of this segment
            if not len(at):
                continue
            e = (pos[at] + 1) // r - 1  # [E] entry ids
            span = 2 * r if r == cfg.csa_ratio else r
            first = (e - (1 if span == 2 * r else 0)) * r  # [E]
            sp = first[:, None] + np.arange(span)[None, :]  # [E, S]
            st = np.full(sp.shape, -1, np.int64)
            st[sp >= 0] = s.swa(sp[sp >= 0])
            acc["emit_rows"].append(row0 + at)
            acc["emit_pos"].append(e * r)
            acc["state"].append(st)
            acc["write"].append(s.comp(fam.index, r, e))

    def t(parts, shape_tail=()):
        if not parts:
            return torch.zeros((0, *shape_tail), dtype=torch.long, device=device)
        return torch.from_numpy(np.concatenate(parts)).to(device)

    ratios = {}
    for r, acc in per_ratio.items():
        span = 2 * r if r == cfg.csa_ratio else r
        ratios[r] = RatioIndex(t(acc["emit_rows"]), t(acc["emit_pos"]), t(acc["state"], (span,)),
                               t(acc["write"]), t(acc["keys"], (width[r],)), t(acc["vis"]))
    return StagedBatch(t(tok), t(pos_all), t(write), t(raw, (window,)), t(logit), ratios)
