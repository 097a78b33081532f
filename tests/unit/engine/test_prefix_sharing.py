"""Prefix caching under pressure: LRU eviction with exact block ids, the hit choosing the
partition, reference counts of concurrent sharers, preemption."""

import pytest

from dspark_loop.contract.protocol import as_i32
from tests.unit.engine.factories import make_mesh, make_scheduler, prompt_ids, tokens_of
from tests.unit.engine.test_prefix_scheduler import SHARED, A, B, assert_pools_full, cold_tokens, make_req, run


def updates_of(mesh, req_id, p=0):
    return [
        (u.family, u.first_page, as_i32(u.block_ids).tolist())
        for plan in mesh.plans
        for u in plan.partitions[p].block_updates
        if u.req_id == req_id
    ]


def test_eviction_takes_free_pages_first_then_the_oldest_cached_tail():
    """With 10 swa blocks: A (33 tokens) keys swa pages 0-7 (blocks 0-7) and frees them
    tail first, so the LRU is [7..0]. B (13 tokens) takes free blocks 9, 8, then evicts 7
    and 6; it reaches no 16-token alignment, so it keys nothing and its blocks go back to
    the free list, not the LRU. A's prompt again then misses the window tail at 32 (pages
    6-7 are gone) and must hit at 16 on blocks 2-3 and c4 block 0, with the cold run's
    tokens."""
    sched = make_scheduler(num_blocks=[10, 4])
    mesh = make_mesh(sched)
    swa, c4 = sched.partitions[0].cache.pools
    a = make_req(sched, "a", prompt_ids(0, 33), 1)
    run(sched, mesh, a)
    assert updates_of(mesh, a.req_id) == [(0, 0, list(range(9))), (1, 0, [0, 1])]
    assert swa.lru_ids() == [7, 6, 5, 4, 3, 2, 1, 0] and swa.free_ids() == [9, 8]
    assert c4.lru_ids() == [1, 0] and c4.free_ids() == [2, 3]
    b = make_req(sched, "b", prompt_ids(5, 13), 1)
    run(sched, mesh, b)
    assert updates_of(mesh, b.req_id) == [(0, 0, [9, 8, 7, 6]), (1, 0, [2])]
    assert swa.num_evicted == 2 and c4.num_evicted == 0
    assert swa.free_ids() == [9, 8, 7, 6] and swa.lru_ids() == [5, 4, 3, 2, 1, 0]
    c = make_req(sched, "c", prompt_ids(0, 33), 4)
    got = run(sched, mesh, c)
    assert c.num_cached_tokens == 16
    # the hit's pages, then new pages: free blocks 9-6, then LRU 5 (2, 3 are shared)
    assert updates_of(mesh, c.req_id) == [
        (0, 2, [2, 3]),
        (1, 0, [0]),
        (0, 4, [9, 8, 7, 6, 5]),
        (1, 1, [3]),
        (1, 2, [2]),
    ]  # decoding reaches c4 row 8
    assert tokens_of(got["c"]) == cold_tokens({"c": (prompt_ids(0, 33), 4)})["c"]
    assert_pools_full(sched)


@pytest.mark.parametrize("caching,want_partition,want_cached", [(True, 0, 32), (False, 1, 0)])
def test_the_longest_hit_decides_the_partition(caching, want_partition, want_cached):
    """A request whose prefix is cached in partition 0 must go there even though
    partition 1 has fewer requests; requests without a hit (or with caching off) go to
    the partition with the fewest requests."""
    sched = make_scheduler(num_partitions=2, enable_prefix_caching=caching)
    mesh = make_mesh(sched)
    run(sched, mesh, make_req(sched, "a", A))
    xs = [make_req(sched, f"x{i}", prompt_ids(7 + i, 8), 40) for i in range(3)]
    for x in xs:
        sched.add(x)
    assert [x.partition for x in xs] == [0, 1, 0]
    b = make_req(sched, "b", B)
    sched.add(b)
    assert b.partition == want_partition
    got = run(sched, mesh)
    assert b.num_cached_tokens == want_cached
    assert tokens_of(got["b"]) == cold_tokens({"b": (B, 6)})["b"]
    assert_pools_full(sched)


def test_shared_pages_count_every_sharer_and_survive_an_abort():
    """Two requests hitting a running request's prefix must raise the c4 pages' ref counts
    to 3 and the window tail's (taken back from the LRU) to 2; aborting one sharer must
    drop one reference and leave the other's tokens unchanged."""
    c_prompt = SHARED + prompt_ids(4, 9)
    want = cold_tokens({"a": (A, 30), "c": (c_prompt, 6)})
    sched = make_scheduler()
    mesh = make_mesh(sched)
    swa, c4 = sched.partitions[0].cache.pools
    a = make_req(sched, "a", A, 30)
    sched.add(a)
    got = {}
    step = sched.schedule()
    got_a = sched.update(step, mesh.run(step.plan))
    # a computed 45 positions: c4 pages 0-1 (blocks 0-1) keyed and held; swa pages
    # behind its window, 6-7 included, keyed and still held until the next schedule
    # releases them (to the LRU), before it maps or admits anything
    assert c4.ref_counts[:2] == [1, 1] and swa.ref_counts[6:8] == [1, 1]
    assert 6 in swa.block_to_key and 7 in swa.block_to_key
    b, c = make_req(sched, "b", B), make_req(sched, "c", c_prompt)
    sched.add(b)
    sched.add(c)
    step = sched.schedule()
    assert a.pages[0].first_page > 7  # a let them go: the 2 references are b's and c's
    assert b.num_computed == c.num_computed == 32
    assert c4.ref_counts[:2] == [3, 3] and swa.ref_counts[6:8] == [2, 2]
    assert 6 not in swa.lru_ids() and 7 not in swa.lru_ids()
    sched.check_integrity()
    outs = got_a + sched.update(step, mesh.run(step.plan))
    sched.abort("b")
    assert c4.ref_counts[:2] == [2, 2]
    sched.check_integrity()
    for o in outs:
        got.setdefault(o.request_id, []).append(o)
    for k, v in run(sched, mesh).items():
        got.setdefault(k, []).extend(v)
    assert tokens_of(got["a"]) == want["a"] and tokens_of(got["c"]) == want["c"]
    assert b.finish_reason == "abort"
    assert_pools_full(sched)
    assert sorted(c4.lru_ids())[:2] == [0, 1]  # still cached after everyone left


def test_a_preempted_request_resumes_from_its_own_cached_prefix():
    """A request preempted by recompute must, when re-admitted, hit the pages it keyed
    before (prompt + outputs so far), keep reporting its first admission's cached
    tokens, and produce the tokens of an unconstrained run."""
    prompts = {f"r{i}": (prompt_ids(i, 8), 40) for i in range(3)}
    want = cold_tokens(prompts)
    sched = make_scheduler(num_blocks=[32, 5])
    mesh = make_mesh(sched)
    reqs = [make_req(sched, k, p, n) for k, (p, n) in prompts.items()]
    got = run(sched, mesh, *reqs)
    assert {k: tokens_of(v) for k, v in got.items()} == want
    resumed = [r for r in reqs if r.num_preemptions]
    assert resumed and all(r.num_cached_tokens == 0 for r in reqs)
    starts = {c.start_pos for plan in mesh.plans for c in plan.partitions[0].prefills}
    assert any(s > 0 and s % 16 == 0 for s in starts)  # a re-admission started on a hit
    assert_pools_full(sched)
