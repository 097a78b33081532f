import pytest

from dspark_loop.contract.flash_layout import flash_layout
from dspark_loop.engine.block_pool import BlockPool
from dspark_loop.engine.kv_cache import PartitionCache, map_limit, pages_needed
from tests.unit.engine.factories import make_layout


def test_block_pool_hands_out_lowest_ids_and_reuses_freed_ones_last():
    """Allocation must be FIFO over the free list: fresh ids in order, freed ids at the back."""
    pool = BlockPool(4)
    assert pool.allocate(2) == [0, 1]
    pool.free([0])
    assert pool.allocate(2) == [2, 3]
    assert pool.allocate(1) == [0]
    assert pool.num_free == 0 and not pool.can_allocate(1)


def test_block_pool_refuses_double_free_and_overdraw():
    """Freeing a free block or allocating past the pool must raise, never corrupt state."""
    pool = BlockPool(2)
    ids = pool.allocate(1)
    pool.free(ids)
    with pytest.raises(RuntimeError):
        pool.free(ids)
    with pytest.raises(RuntimeError):
        pool.allocate(3)


def test_pages_needed_follow_tokens_for_swa_and_boundaries_for_compressed():
    """swa needs the page of every written position; c4 only the page of each written
    compressed row (a row exists once its 4th token is written)."""
    swa, c4 = make_layout().families  # swa: 4 tokens/page; c4: 4 rows (16 tokens)/page
    assert [pages_needed(swa, e) for e in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert [pages_needed(c4, e) for e in (3, 4, 16, 19, 20)] == [0, 1, 1, 1, 2]
    # map_limit is the inverse: the largest end that needs no new page
    assert map_limit(swa, 2) == 8
    assert map_limit(c4, 1) == 19 and pages_needed(c4, 19) == 1 and pages_needed(c4, 20) == 2


def test_ring_pages_are_released_exactly_when_they_leave_the_window():
    """A swa page must be released once the next write position is window-1 tokens past
    it, never earlier; c4 pages must stay until the request is freed."""
    layout = make_layout()  # window 8, swa page 4 tokens
    cache = PartitionCache(layout, [8, 4])
    pages = cache.new_pages()
    cache.allocate(pages, cache.num_new_pages(pages, 12))  # positions 0..11
    # c4 rows 0..2 (boundaries at positions 3, 7, 11) all live on c4 page 0
    assert pages[0].block_ids == [0, 1, 2] and pages[1].block_ids == [0]
    # next write at 11: reads reach back to 4 -> page 0 (positions 0..3) is dead
    assert cache.release_behind(pages, 10) == 11  # nothing released yet; page 0 goes at 11
    assert (pages[0].first_page, pages[0].block_ids) == (0, [0, 1, 2]) and cache.num_free() == [5, 3]
    assert cache.release_behind(pages, 11) == 15  # page 0 released; page 1 goes at 15
    assert (pages[0].first_page, pages[0].block_ids) == (1, [1, 2])
    assert cache.num_free() == [6, 3]
    cache.check_integrity([pages])


def test_integrity_check_finds_a_leaked_block():
    """A block neither free nor owned by a request must fail check_integrity()."""
    cache = PartitionCache(make_layout(), [4, 4])
    pages = cache.new_pages()
    cache.allocate(pages, [2, 0])
    pages[0].block_ids.pop()  # the request forgets block 1
    with pytest.raises(AssertionError, match="ref counts"):
        cache.check_integrity([pages])


def test_the_hot_path_page_arithmetic_equals_the_family_rules():
    """PartitionCache's inlined num_new_pages / map_limit must agree with pages_needed and
    map_limit for every family, end position and mapped length."""
    cache = PartitionCache(flash_layout(), [4096, 4096, 4096])
    for end in range(0, 9000, 7):
        assert cache.num_new_pages(cache.new_pages(), end) == [pages_needed(f, end) for f in cache.families]
    for swa in range(0, 40):
        for c128 in range(3):
            pages = cache.new_pages()
            pages[0].first_page, pages[0].block_ids = swa // 3, list(range(swa - swa // 3))
            pages[1].block_ids, pages[2].block_ids = list(range(swa // 4)), list(range(c128))
            want = min(map_limit(f, fp.end_page) for f, fp in zip(cache.families, pages))
            assert cache.map_limit(pages) == want


def test_grow_maps_what_num_new_pages_asks_or_changes_nothing():
    """grow() must map exactly num_new_pages' counts (same ids as allocate) and report the
    new map_limit; when any pool is short it must return None and leave pools and pages
    untouched."""
    a, b = PartitionCache(flash_layout(), [64, 16, 16]), PartitionCache(flash_layout(), [64, 16, 16])
    pa, pb = a.new_pages(), b.new_pages()
    for end in (1, 33, 129, 300, 513, 900):
        grown, limit = a.grow(pa, end)
        assert grown == b.allocate(pb, b.num_new_pages(pb, end))
        assert limit == a.map_limit(pa) == b.map_limit(pb) and limit >= end
    before = ([p.num_free for p in a.pools], [(fp.first_page, list(fp.block_ids)) for fp in pa])
    assert a.grow(pa, 64 * 32 + 1) is None  # the swa pool has 64 pages
    assert before == ([p.num_free for p in a.pools], [(fp.first_page, list(fp.block_ids)) for fp in pa])


def test_release_behind_frees_what_left_the_window_and_names_the_next_release():
    """release_behind() must free exactly the ring pages below Family.first_live_page(next
    write position), to the back of the free list, keep every other page, and return the
    smallest later position whose first live page passes the ring's new first page."""
    cache = PartitionCache(flash_layout(), [64, 16, 16])
    pages = cache.new_pages()
    swa = cache.families[0]
    assert swa.ring and not any(f.ring for f in cache.families[1:])
    for end in range(1, 1500, 37):
        cache.grow(pages, end)
        before = [(fp.first_page, list(fp.block_ids)) for fp in pages]
        free_before = [p.free_ids() for p in cache.pools]
        pos = cache.release_behind(pages, end)
        first, ids = before[0]
        n = max(0, min(swa.first_live_page(end) - first, len(ids)))
        assert (pages[0].first_page, pages[0].block_ids) == (first + n, ids[n:])
        assert [(fp.first_page, fp.block_ids) for fp in pages[1:]] == before[1:]
        assert [p.free_ids() for p in cache.pools] == [free_before[0] + ids[:n]] + free_before[1:]
        assert pos == next(p for p in range(end, end + 1000) if swa.first_live_page(p) > first + n)
