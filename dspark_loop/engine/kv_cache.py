"""Host-side page allocation: one BlockPool per cache family per partition.

A request's pages in one family are a contiguous run of page numbers
[first_page, first_page + len(block_ids)); page n holds positions
[n * tokens_per_page, (n+1) * tokens_per_page) (for c{r}: compressed rows
[n * rows_per_page, ...), i.e. the same token span).

    swa (ring, window W)        c{r} (full history)
    page:  0  1  2 [3  4  5]    page:  0  1  2  3
           released  live             every page stays until the request ends
           first_page = 3

Ring pages wholly before Family.first_live_page(next write position) are released
(release_behind) at the top of the next schedule, before it maps anything; the ranks never
read them again, so no message says so.

Each family's blocks come from a BlockPool (block_pool.py), which also keeps the prefix
cache's LRU of released pages.
"""

from __future__ import annotations

from dspark_loop.contract.cache_layout import CacheLayout, Family
from dspark_loop.engine.block_pool import BlockPool


class FamilyPages:
    """One request's pages in one family."""

    __slots__ = ("first_page", "block_ids")

    def __init__(self):
        self.first_page = 0
        self.block_ids: list[int] = []

    @property
    def end_page(self) -> int:
        return self.first_page + len(self.block_ids)


def pages_needed(fam: Family, end_pos: int) -> int:
    """Pages [0, n) a step writing positions < end_pos must have mapped in `fam`."""
    if fam.ratio == 0:
        return fam.num_pages(end_pos)
    # c{r}: boundary p writes compressed row p // r when (p+1) % r == 0, so the rows
    # written so far are [0, end_pos // r).
    num_rows = end_pos // fam.ratio
    return -(-num_rows // fam.rows_per_page)


def map_limit(fam: Family, end_page: int) -> int:
    """Largest end position whose writes fit in pages [0, end_page) of `fam`."""
    if fam.ratio == 0:
        return end_page * fam.tokens_per_page
    # rows [0, end_page * rows_per_page) are mapped; the next row is written by the
    # boundary at position (rows + 1) * r - 1, so ends up to that position are fine.
    return (end_page * fam.rows_per_page + 1) * fam.ratio - 1


class PartitionCache:
    """The pools of one partition (TP group); every rank of the group mirrors them."""

    def __init__(self, layout: CacheLayout, num_blocks: list[int]):
        if len(num_blocks) != len(layout.families):
            raise ValueError(f"{len(num_blocks)} pool sizes for {len(layout.families)} families")
        self.layout = layout
        self.families = layout.families
        self.pools = [BlockPool(n) for n in num_blocks]
        self._spans = [(f.ratio, f.tokens_per_page, f.rows_per_page) for f in self.families]
        # (index, window, tokens per page) of each ring family
        self._ring_spans = [(f, fam.window, fam.tokens_per_page) for f, fam in enumerate(self.families) if fam.ring]

    def new_pages(self) -> list[FamilyPages]:
        return [FamilyPages() for _ in self.families]

    def num_new_pages(self, pages: list[FamilyPages], end_pos: int) -> list[int]:
        counts = []
        for (ratio, tokens, rows), fp in zip(self._spans, pages):
            # pages_needed(), inlined: this runs for every request that crosses a page
            need = -(-end_pos // tokens) if ratio == 0 else -(-(end_pos // ratio) // rows)
            have = fp.first_page + len(fp.block_ids)
            counts.append(need - have if need > have else 0)
        return counts

    def grow(self, pages: list[FamilyPages], end_pos: int) -> tuple[list[tuple[int, int, list[int]]], int] | None:
        """num_new_pages + can_allocate + allocate + map_limit in one pass over the families (a
        running request crossing a page boundary, ~40 per step at 256 requests x 8 rows): the
        grown families as allocate() returns them and the new map_limit; None when a pool is
        short, and then nothing changed (the caller preempts)."""
        todo = []  # (family, pages to add, first new page)
        limit = 1 << 62
        for f, (ratio, tokens, rows) in enumerate(self._spans):
            fp = pages[f]
            have = fp.first_page + len(fp.block_ids)
            # pages_needed() and map_limit() of the family after growing, inlined
            if ratio == 0:
                need = -(-end_pos // tokens)
                if need > have:
                    todo.append((f, need - have, have))
                    have = need
                end = have * tokens
            else:
                need = -(-(end_pos // ratio) // rows)
                if need > have:
                    todo.append((f, need - have, have))
                    have = need
                end = (have * rows + 1) * ratio - 1
            if end < limit:
                limit = end
        pools = self.pools
        for f, n, _ in todo:
            if n > pools[f].num_free:
                return None
        grown = []
        for f, n, first in todo:
            ids = pools[f].allocate(n)
            grown.append((f, first, ids))
            pages[f].block_ids.extend(ids)
        return grown, limit

    def can_allocate(self, counts: list[int], shared: list[FamilyPages] | None = None) -> bool:
        """Room for counts new pages per family, after taking the `shared` (hit) pages."""
        if shared is None:
            for pool, n in zip(self.pools, counts):
                if n and n > pool.num_free:
                    return False
            return True
        return all(n + p.num_unowned(fp.block_ids) <= p.num_free for p, n, fp in zip(self.pools, counts, shared))

    def share(self, pages: list[FamilyPages]) -> None:
        """Take a reference on every block of a prefix hit's pages."""
        for pool, fp in zip(self.pools, pages):
            pool.touch(fp.block_ids)

    def allocate(self, pages: list[FamilyPages], counts: list[int]) -> list[tuple[int, int, list[int]]]:
        """Map the pages; returns (family, first_page, block_ids) per family that grew."""
        updates = []
        for f, (fp, n) in enumerate(zip(pages, counts)):
            if n == 0:
                continue
            ids = self.pools[f].allocate(n)
            updates.append((f, fp.first_page + len(fp.block_ids), ids))
            fp.block_ids.extend(ids)
        return updates

    def map_limit(self, pages: list[FamilyPages]) -> int:
        """Positions < this can be written without allocating (the hot-path check)."""
        limit = 1 << 62
        for (ratio, tokens, rows), fp in zip(self._spans, pages):
            # map_limit(), inlined (asked after every mapping)
            end_page = fp.first_page + len(fp.block_ids)
            end = end_page * tokens if ratio == 0 else (end_page * rows + 1) * ratio - 1
            if end < limit:
                limit = end
        return limit

    def release_behind(self, pages: list[FamilyPages], next_pos: int) -> int:
        """Free ring pages wholly behind the window of a step writing from next_pos (below
        Family.first_live_page(next_pos)); returns the next write position at which it would
        free more (0: a ring family holds no page, so ask again next step). One pass over
        the ring families (a request moving past a ring page, ~35 per step at 256 requests
        x 8 rows)."""
        pos = 1 << 62
        for f, window, tokens in self._ring_spans:
            fp = pages[f]
            ids, first = fp.block_ids, fp.first_page
            n = min(max(0, next_pos - window + 1) // tokens - first, len(ids))  # first_live_page - first
            if n > 0:
                freed = ids[:n]
                del ids[:n]
                first += n
                fp.first_page = first
                self.pools[f].free(freed)
            if not ids:
                pos = 0
            elif pos:
                pos = min(pos, (first + 1) * tokens + window - 1)  # first_live_page(p) > first  <=>  p >= this
        return pos

    def free(self, pages: list[FamilyPages]) -> None:
        for f, fp in enumerate(pages):
            self.pools[f].free(fp.block_ids)
            fp.block_ids = []
            fp.first_page = 0

    def num_free(self) -> list[int]:
        return [p.num_free for p in self.pools]

    def usage(self) -> float:
        """Fraction of pages in use, over all families."""
        total = sum(p.num_blocks for p in self.pools)
        return 0.0 if total == 0 else 1.0 - sum(p.num_free for p in self.pools) / total

    def check_integrity(self, owners: list[list[FamilyPages]]) -> None:
        """Every block is free, LRU-cached or referenced exactly as often as owners map it."""
        for f, pool in enumerate(self.pools):
            refs = [0] * pool.num_blocks
            for pages in owners:
                for b in pages[f].block_ids:
                    refs[b] += 1
            pool.check_integrity(f, refs)
