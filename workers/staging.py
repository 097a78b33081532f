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
from functools import cached_property

import numpy as np
import torch

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import BlockUpdate, as_i32
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
        per_fam = self.tables.setdefault(update.req_id, [np.full(0, -1, np.int32) for _ in range(self.num_families)])
        t = per_fam[update.family]
        end = update.first_page + len(ids)
        if end > len(t):
            t = np.concatenate([t, np.full(max(end - len(t), len(t)), -1, np.int32)])
            per_fam[update.family] = t
        t[update.first_page : end] = ids

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

    # Derived once per step (every layer of this ratio reads them).
    @cached_property
    def state_gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """state_slots clamped to a valid index [E, S], and where they are real [E, S]."""
        return self.state_slots.clamp(min=0), self.state_slots >= 0

    @cached_property
    def key_gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """key_slots clamped [T, N], and where they are real [T, N]."""
        return self.key_slots.clamp(min=0), self.key_slots >= 0

    @cached_property
    def width_groups(self) -> list[tuple[int, torch.Tensor | None]]:
        """Rows by their bucketed visible-entry width: (width, row ids or None for all rows)."""
        width = (self.num_visible + KEY_BUCKET - 1) // KEY_BUCKET * KEY_BUCKET  # [T]
        widths = width.unique().tolist()
        if len(widths) == 1:
            return [(widths[0], None)]
        return [(w, (width == w).nonzero().squeeze(1)) for w in widths]


@dataclass
class StagedBatch:
    token_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    write_slots: torch.Tensor  # [T] swa slot of each row's own raw kv / state rows
    raw_slots: torch.Tensor  # [T, W] swa slots of positions p-W+1 .. p, -1 before 0
    logit_rows: torch.Tensor  # [L] rows whose logits are wanted, in segment order
    ratios: dict[int, RatioIndex] = field(default_factory=dict)

    @cached_property
    def raw_gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """raw_slots clamped to a valid index [T, W], and where they are real [T, W]."""
        return self.raw_slots.clamp(min=0), self.raw_slots >= 0

    @property
    def num_rows(self) -> int:
        return int(self.token_ids.shape[0])


class _Slots:
    """Slot lookups for rows of many segments at once: seg [m] (segment index) and positions
    / entry ids [m], vectorised over the whole step (no per-segment loop).

        tables  [S, P] per family: each segment's page table, -1 padded
        pub_end [S]    rows at positions >= pub_end write to scratch, from scratch base [S]
    """

    def __init__(
        self,
        segments: list[Segment],
        tables: BlockTables,
        layout: CacheLayout,
        pub_end: np.ndarray,
        swa_scratch: np.ndarray,
        comp_scratch: dict[int, np.ndarray],
    ) -> None:
        self.segments, self.tables, self.layout = segments, tables, layout
        self.pub_end, self.swa_scratch, self.comp_scratch = pub_end, swa_scratch, comp_scratch
        self._matrices: dict[int, np.ndarray] = {}

    def _matrix(self, family: int) -> np.ndarray:
        m = self._matrices.get(family)
        if m is None:
            rows = [self.tables.tables.get(seg.req_id) for seg in self.segments]
            width = max([len(r[family]) for r in rows if r is not None], default=0)
            m = np.full((len(rows), max(width, 1)), -1, np.int64)
            for i, r in enumerate(rows):
                if r is not None:
                    m[i, : len(r[family])] = r[family]
            self._matrices[family] = m
        return m

    def _lookup(self, family: int, seg: np.ndarray, page: np.ndarray, what: str) -> np.ndarray:
        m = self._matrix(family)
        blocks = np.where(page < m.shape[1], m[seg, np.minimum(page, m.shape[1] - 1)], -1)
        bad = blocks < 0
        if bad.any():
            first = int(seg[bad].min())  # the earliest segment's missing pages
            req = self.segments[first].req_id
            self.tables.get(req, family)  # KeyError for a request with no table at all
            missing = sorted(set(page[bad & (seg == first)].tolist()))
            raise ValueError(
                f"request {req}: family {self.layout.families[family].name} "
                f"has no block for page(s) {missing[:8]} ({what})"
            )
        return blocks

    def swa(self, seg: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Slots of positions pos (all >= 0 and already written or written this step)."""
        bs = self.layout.block_size
        end = self.pub_end[seg]
        pub = pos < end
        out = self.swa_scratch[seg] + (pos - end)
        if pub.any():
            p = pos[pub]
            out[pub] = self._lookup(0, seg[pub], p // bs, "raw kv") * bs + p % bs
        return out

    def comp(self, fam_index: int, r: int, seg: np.ndarray, j: np.ndarray) -> np.ndarray:
        rpp = self.layout.families[fam_index].rows_per_page
        first_unpub = (self.pub_end[seg] + r) // r - 1  # entries whose boundary row is unpublished
        pub = j < first_unpub
        out = self.comp_scratch[r][seg] + (j - first_unpub)
        if pub.any():
            jj = j[pub]
            out[pub] = self._lookup(fam_index, seg[pub], jj // rpp, f"c{r} entries") * rpp + jj % rpp
        return out


def bucket(n: np.ndarray | int) -> np.ndarray | int:
    return -(-n // KEY_BUCKET) * KEY_BUCKET


def _exclusive_cumsum(a: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(a)[:-1]]).astype(np.int64) if len(a) else a.astype(np.int64)


def stage(
    segments: list[Segment],
    tables: BlockTables,
    layout: CacheLayout,
    cfg: ModelConfig,
    pool: KVPool,
    device: str | torch.device = "cpu",
) -> StagedBatch:
    window = cfg.sliding_window
    comp_fams = {f.ratio: f for f in layout.families if f.ratio}
    n = np.array([len(seg.token_ids) for seg in segments], np.int64)  # [S]
    n_pub = np.array([seg.n_publish for seg in segments], np.int64)
    start = np.array([seg.start_pos for seg in segments], np.int64)
    bad = np.nonzero((n_pub < 0) | (n_pub > n))[0]
    if len(bad):
        seg = segments[bad[0]]
        raise ValueError(f"request {seg.req_id}: n_publish {seg.n_publish} outside [0, {n[bad[0]]}]")
    pub_end = start + n_pub
    swa_fam = pool.families[0]
    if (n - n_pub).sum() > swa_fam.scratch_rows:
        raise ValueError(f"more than {swa_fam.scratch_rows} unpublished rows in one step")
    swa_scratch = swa_fam.scratch_base + _exclusive_cumsum(n - n_pub)  # [S]
    comp_scratch = {}
    for r, fam in comp_fams.items():
        count = np.maximum(0, (start + n) // r - ((pub_end + r) // r - 1))  # [S] unpublished entries
        fam_slots = pool.families[fam.index]
        if count.sum() > fam_slots.scratch_rows:
            raise ValueError(f"more than {fam_slots.scratch_rows} unpublished c{r} entries in one step")
        comp_scratch[r] = fam_slots.scratch_base + _exclusive_cumsum(count)
    slots = _Slots(segments, tables, layout, pub_end, swa_scratch, comp_scratch)

    row0 = _exclusive_cumsum(n)  # [S] first row of each segment
    seg = np.repeat(np.arange(len(segments)), n)  # [T] segment of each row
    pos = start[seg] + np.arange(len(seg)) - row0[seg]  # [T]
    tok = np.concatenate([np.asarray(s.token_ids, np.int64) for s in segments]) if segments else pos
    logit = (
        np.concatenate([row0[i] + np.asarray(s.logit_rows, np.int64) for i, s in enumerate(segments)])
        if segments
        else pos
    )
    write = slots.swa(seg, pos)
    q = pos[:, None] - np.arange(window - 1, -1, -1)[None, :]  # [T, W] oldest first
    raw = np.full(q.shape, -1, np.int64)
    seen = q >= 0
    raw[seen] = slots.swa(np.broadcast_to(seg[:, None], q.shape)[seen], q[seen])

    on_cpu = torch.device(device).type == "cpu"

    def t(a):
        out = torch.from_numpy(np.ascontiguousarray(a, np.int64))
        return out if on_cpu else out.to(device)

    ratios = {}
    for r, fam in comp_fams.items():
        vis = (pos + 1) // r  # [T]
        width = int(bucket(vis.max() if len(vis) else 0))
        j = np.broadcast_to(np.arange(width)[None, :], (len(pos), width))  # [T, N]
        keys = np.full(j.shape, -1, np.int64)
        m = j < vis[:, None]
        keys[m] = slots.comp(fam.index, r, np.broadcast_to(seg[:, None], j.shape)[m], j[m])
        at = np.nonzero((pos + 1) % r == 0)[0]  # [E] boundary rows, in row order
        e = (pos[at] + 1) // r - 1  # [E] entry ids
        span = 2 * r if r == cfg.csa_ratio else r
        first = (e - (1 if span == 2 * r else 0)) * r  # [E]
        sp = first[:, None] + np.arange(span)[None, :]  # [E, S]
        st = np.full(sp.shape, -1, np.int64)
        ok = sp >= 0
        st[ok] = slots.swa(np.broadcast_to(seg[at][:, None], sp.shape)[ok], sp[ok])
        ratios[r] = RatioIndex(t(at), t(e * r), t(st), t(slots.comp(fam.index, r, seg[at], e)), t(keys), t(vis))
    return StagedBatch(t(tok), t(pos), t(write), t(raw), t(logit), ratios)
