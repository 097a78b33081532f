"""Prefix-cache mechanics below the scheduler: the pool's keys and LRU, chained hashes,
registration of full pages and the hit lookup."""

import pytest

from dspark_loop.engine.block_pool import BlockPool
from dspark_loop.engine.kv_cache import PartitionCache
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.prefix_cache import PrefixCache
from tests.unit.engine.factories import make_layout, make_scheduler, prompt_ids


def cached_pool() -> BlockPool:
    """4 blocks: 0 and 1 cached under keys 100/101 and released (LRU), 2 and 3 free."""
    pool = BlockPool(4)
    ids = pool.allocate(2)
    assert pool.register(ids[0], 100) and pool.register(ids[1], 101)
    pool.free(ids)
    return pool


def test_freed_cached_blocks_go_to_the_lru_tail_first_and_stay_hittable():
    """A released request's cached pages must enter the LRU last page first (so eviction
    eats a prefix from its end), count as free, and still answer lookups."""
    pool = cached_pool()
    assert pool.lru_ids() == [1, 0] and pool.free_ids() == [2, 3]
    assert pool.num_free == 4
    assert pool.lookup(100) == 0 and pool.lookup(101) == 1
    pool.check_integrity(0, [0, 0, 0, 0])


def test_allocation_takes_free_blocks_before_evicting_the_oldest_cached_one():
    """allocate() must drain the free list first, then evict LRU blocks oldest first and
    drop their keys."""
    pool = cached_pool()
    assert pool.allocate(3) == [2, 3, 1]
    assert pool.lookup(101) is None and pool.lookup(100) == 0
    assert pool.lru_ids() == [0] and pool.num_evicted == 1
    pool.check_integrity(0, [0, 1, 1, 1])


def test_a_hit_takes_references_and_the_last_release_returns_the_block_to_the_lru():
    """touch() must lift a block out of the LRU and count one reference per sharer; the
    block goes back to the LRU only when the last sharer frees it."""
    pool = cached_pool()
    pool.touch([0])
    pool.touch([0])
    assert pool.ref_counts[0] == 2 and pool.lru_ids() == [1] and pool.num_free == 3
    assert pool.num_unowned([0, 1]) == 1
    pool.free([0])
    assert pool.lru_ids() == [1]
    pool.free([0])
    assert pool.lru_ids() == [1, 0]
    with pytest.raises(RuntimeError):
        pool.free([0])


def test_a_key_is_registered_once():
    """Two requests that computed the same prefix side by side must not both key it: the
    second block stays uncached and goes to the free list when released."""
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    assert pool.register(a, 7) is True and pool.register(b, 7) is False
    pool.free([a, b])
    assert pool.lru_ids() == [a] and pool.free_ids() == [b]


def test_integrity_check_finds_an_owned_block_in_the_lru():
    """A block in the LRU while a request still maps it must fail check_integrity()."""
    pool = cached_pool()
    with pytest.raises(AssertionError):
        pool.check_integrity(0, [1, 0, 0, 0])


def make_req(tokens):
    sched = make_scheduler()
    return sched.make_request(GenerateRequest("r", list(tokens), SamplingParams(max_tokens=4)))


def test_chunk_hashes_name_the_whole_prefix_and_are_computed_once():
    """hashes[k] must depend on every token before the chunk's end (same chunk, other
    prefix: other hash), only whole chunks are hashed, and extending reuses the list."""
    layout = make_layout()
    prefix = PrefixCache(layout, spec_k=0)
    assert prefix.chunk == 4 and prefix.align == 16
    toks = prompt_ids(0, 22)
    a, b = make_req(toks), make_req([toks[1]] + toks[1:])
    ha = list(prefix.hashes(a, 10))
    assert len(ha) == 2
    hb = prefix.hashes(b, 22)
    assert len(hb) == 5 and ha[0] != hb[0] and ha[1] != hb[1]  # chunk 1 equal, prefix not
    again = prefix.hashes(a, 22)
    assert again is a.prefix_hashes and again[:2] == ha and len(again) == 5
    assert prefix.hashes(make_req(toks), 22) == again


def test_only_pages_below_the_last_aligned_committed_position_are_registered():
    """register() must key the pages wholly below num_computed rounded down to the prefix
    alignment (16: swa pages of 4, c4 pages of 16 tokens; a hit is never longer), and
    nothing for positions written but not committed."""
    layout = make_layout()
    prefix = PrefixCache(layout, spec_k=0)
    cache = PartitionCache(layout, [16, 4])
    req = make_req(prompt_ids(0, 30))
    req.pages = cache.new_pages()
    cache.allocate(req.pages, cache.num_new_pages(req.pages, 23))  # positions 0..22 written
    prefix.start(req, 0)
    assert req.register_pos == 16
    req.num_computed = 15  # the rest is (say) rejected verify rows
    prefix.register(cache, req)
    swa, c4 = cache.pools
    assert swa.block_to_key == {} and c4.block_to_key == {} and req.register_pos == 16
    req.num_computed = 23
    prefix.register(cache, req)
    assert sorted(swa.block_to_key) == [0, 1, 2, 3] and sorted(c4.block_to_key) == [0]
    assert req.register_pos == 32
    assert len(req.prefix_hashes) == 4  # one hash per whole chunk of 4, never per token


def test_lookup_needs_the_c4_run_and_the_window_tail_and_caps_by_replay():
    """find() must return the longest aligned h whose c4 pages [0, h/16) and swa window
    pages [first_live_page(h), h/4) are all cached, with h <= tokens - max(1, replay)."""
    layout = make_layout()
    cache = PartitionCache(layout, [16, 4])
    writer = make_req(prompt_ids(0, 40))
    writer.pages = cache.new_pages()
    cache.allocate(writer.pages, cache.num_new_pages(writer.pages, 33))
    writer.num_computed = 33
    k0 = PrefixCache(layout, spec_k=0)
    k0.start(writer, 0)
    k0.register(cache, writer)
    cache.free(writer.pages)  # swa pages 0..7 and c4 pages 0, 1 stay keyed in the LRU
    hit = k0.find(cache, make_req(prompt_ids(0, 33)))
    assert hit.num_tokens == 32
    # window 8 at h = 32: swa pages (32 - 8 + 1) // 4 = 6 and 7 only
    assert [(fp.first_page, fp.block_ids) for fp in hit.pages] == [(6, [6, 7]), (0, [0, 1])]
    assert k0.find(cache, make_req(prompt_ids(0, 32))).num_tokens == 16  # cap 31 -> 16
    assert k0.find(cache, make_req(prompt_ids(0, 16))) is None
    assert PrefixCache(layout, spec_k=7).find(cache, make_req(prompt_ids(0, 40))) is None
    # without swa page 7 the tail at 32 is gone, the one at 16 (pages 2, 3) is not
    del cache.pools[0].key_to_block[cache.pools[0].block_to_key.pop(7)]
    cache.pools[0]._lru.pop(7)
    cache.pools[0]._free.append(7)
    hit = k0.find(cache, make_req(prompt_ids(0, 33)))
    assert hit.num_tokens == 16
    assert [(fp.first_page, fp.block_ids) for fp in hit.pages] == [(2, [2, 3]), (0, [0])]
