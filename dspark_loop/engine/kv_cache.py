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
after each step; the ranks never read them again, so no message says so.
Reference counts are there for prefix caching (a later issue): today every live block
has exactly one owner.
"""
from __future__ import annotations

from collections import deque

from dspark_loop.cache_layout import CacheLayout, Family


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # NOTE: FIFO free list: freed blocks go to the back, so a block just released is
        # the last to be reused (good for a future prefix cache, and deterministic ids).
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, num: int) -> bool:
        return num <= len(self._free)

    def allocate(self, num: int) -> list[int]:
        if num > len(self._free):
            raise RuntimeError(f"pool exhausted: want {num}, {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(num)]
        for b in ids:
            self.ref_counts[b] = 1
        return ids

    def free(self, block_ids) -> None:
        for b in block_ids:
            n = self.ref_counts[b] - 1
            if n < 0:
                raise RuntimeError(f"block {b} freed twice")
            self.ref_counts[b] = n
            if n == 0:
                self._free.append(b)

    def free_ids(self) -> list[int]:
        return list(self._free)


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

    def new_pages(self) -> list[FamilyPages]:
        return [FamilyPages() for _ in self.families]

    def num_new_pages(self, pages: list[FamilyPages], end_pos: int) -> list[int]:
        return [max(0, pages_needed(f, end_pos) - fp.end_page)
                for f, fp in zip(self.families, pages)]

    def can_allocate(self, counts: list[int]) -> bool:
        return all(p.can_allocate(n) for p, n in zip(self.pools, counts))

    def allocate(self, pages: list[FamilyPages], counts: list[int]) -> list[tuple[int, int, list[int]]]:
        """Map the pages; returns (family, first_page, block_ids) per family that grew."""
        updates = []
        for f, (fp, n) in enumerate(zip(pages, counts)):
            if n == 0:
                continue
            ids = self.pools[f].allocate(n)
            updates.append((f, fp.end_page, ids))
            fp.block_ids.extend(ids)
        return updates

    def map_limit(self, pages: list[FamilyPages]) -> int:
        """Positions < this can be written without allocating (the hot-path check)."""
        return min(map_limit(f, fp.end_page) for f, fp in zip(self.families, pages))

    def release_ring(self, pages: list[FamilyPages], next_pos: int) -> list[tuple[int, list[int]]]:
        """Free ring pages wholly behind the window of a step writing from next_pos."""
        released = []
        for f, fam in enumerate(self.families):
            if not fam.ring:
                continue
            fp = pages[f]
            n = min(fam.first_live_page(next_pos) - fp.first_page, len(fp.block_ids))
            if n <= 0:
                continue
            ids = fp.block_ids[:n]
            del fp.block_ids[:n]
            fp.first_page += n
            self.pools[f].free(ids)
            released.append((f, ids))
        return released

    def release_pos(self, pages: list[FamilyPages]) -> int:
        """The next write position at which release_ring() would free something."""
        pos = 1 << 62
        for fam, fp in zip(self.families, pages):
            if fam.ring:
                if not fp.block_ids:
                    return 0
                # first_live_page(next_pos) > first_page  <=>  next_pos >= this
                pos = min(pos, (fp.first_page + 1) * fam.tokens_per_page + fam.window - 1)
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
        """Every block is free xor referenced exactly as many times as the owners say."""
        for f, pool in enumerate(self.pools):
            refs = [0] * pool.num_blocks
            for pages in owners:
                for b in pages[f].block_ids:
                    refs[b] += 1
            free = pool.free_ids()
            if len(set(free)) != len(free):
                raise AssertionError(f"family {f}: duplicate ids in the free list")
            for b in free:
                if refs[b]:
                    raise AssertionError(f"family {f}: block {b} is free and owned")
            if refs != pool.ref_counts:
                bad = [b for b in range(pool.num_blocks) if refs[b] != pool.ref_counts[b]]
                raise AssertionError(f"family {f}: ref counts disagree at blocks {bad[:8]}")
            if len(free) + sum(1 for r in refs if r) != pool.num_blocks:
                raise AssertionError(f"family {f}: leaked blocks")
