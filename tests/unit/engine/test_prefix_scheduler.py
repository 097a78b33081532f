"""Prefix caching through the scheduler and the fake mesh (which checks the content of
every page a request reads, so a hit mapped to the wrong pages fails loudly).

Tiny layout: swa pages of 4 tokens (window 8), c4 pages of 16 tokens: hits align to 16
and need prompt_len >= 16 + max(1, replay): 17 tokens at K=0, 144 at K=7.
"""

import numpy as np
import pytest

from dspark_loop.contract.protocol import as_i8, as_i32
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.step_trace import request_stats
from tests.unit.engine.factories import make_mesh, make_scheduler, prompt_ids, run_step, tokens_of


def make_req(sched, name, tokens, max_tokens=6):
    g = GenerateRequest(name, [int(t) for t in tokens], SamplingParams(max_tokens=max_tokens))
    return sched.make_request(g)


def run(sched, mesh, *reqs, ref=None):
    """Add reqs and run to completion; with ref (name -> K=0 tokens) inject K=7 drafts
    that are right for a varying number of tokens. Returns name -> outputs."""
    for r in reqs:
        sched.add(r)
    got = {}
    for step_no in range(2000):
        if not sched.has_work:
            return got
        _, outs = run_step(sched, mesh)
        for o in outs:
            got.setdefault(o.request_id, []).append(o)
        sched.check_integrity()
        for i, r in enumerate(reqs):
            if ref is not None and not r.finished and not r.is_prefilling and r.output_ids:
                n = len(r.output_ids)
                truth = ref[r.request_id][n : n + 7]
                drafts = np.array(truth + [0] * (7 - len(truth)), np.int32)
                c = (step_no + i) % 8  # the first c drafts are right
                if c < 7:
                    drafts[c] = drafts[c] % 300 + 3
                sched.partitions[r.partition].set_drafts(r, drafts)
    raise AssertionError("requests did not finish")


def cold_tokens(prompts: dict, **kw) -> dict:
    """Each prompt alone in a fresh scheduler without prefix caching."""
    out = {}
    for name, (tokens, max_tokens) in prompts.items():
        sched = make_scheduler(**kw, enable_prefix_caching=False)
        got = run(sched, make_mesh(sched), make_req(sched, name, tokens, max_tokens))
        out[name] = tokens_of(got[name])
    return out


def assert_pools_full(sched):
    """Every page is back: free or cached in the LRU, none referenced."""
    sched.check_integrity()
    for part in sched.partitions:
        for pool in part.cache.pools:
            assert pool.num_free == pool.num_blocks and not any(pool.ref_counts)


def block_map(mesh, p=0) -> dict:
    """(req_id, family, page) -> block over every plan sent to partition p."""
    m = {}
    for plan in mesh.plans:
        for u in plan.partitions[p].block_updates:
            for k, b in enumerate(as_i32(u.block_ids).tolist()):
                m[(u.req_id, u.family, u.first_page + k)] = b
    return m


def first_chunk(mesh, req_id, p=0):
    for plan in mesh.plans:
        for c in plan.partitions[p].prefills:
            if c.req_id == req_id:
                return c.start_pos, len(as_i32(c.token_ids))


SHARED = prompt_ids(0, 40)
A = SHARED + prompt_ids(1, 5)  # 45 tokens
B = SHARED + prompt_ids(2, 9)  # 49 tokens: shares 40, cap 48 -> the hit is 32 (c4 pages 0, 1)


def test_a_second_request_sharing_a_prefix_reads_the_first_ones_pages():
    """B must start prefill at the aligned hit (32 of its 40 shared tokens), map exactly
    A's c4 pages 0-1 and A's swa pages 6-7 (the window tail at 32), report 32 cached
    tokens, and produce exactly the tokens of a cold run."""
    want = cold_tokens({"a": (A, 6), "b": (B, 6)})
    sched = make_scheduler()
    mesh = make_mesh(sched)
    a, b = make_req(sched, "a", A), make_req(sched, "b", B)
    got = run(sched, mesh, a)
    got.update(run(sched, mesh, b))
    assert {k: tokens_of(v) for k, v in got.items()} == want
    assert [o.num_cached_tokens for o in got["b"]] == [32] * len(got["b"])
    assert got["a"][-1].num_cached_tokens == 0 and b.num_cached_tokens == 32
    m = block_map(mesh)
    assert first_chunk(mesh, b.req_id) == (32, 17)
    assert [m[(b.req_id, 1, n)] for n in (0, 1)] == [m[(a.req_id, 1, n)] for n in (0, 1)]
    assert [m[(b.req_id, 0, n)] for n in (6, 7)] == [m[(a.req_id, 0, n)] for n in (6, 7)]
    assert (b.req_id, 0, 5) not in m  # pages behind the window are not needed
    assert request_stats(b).num_cached_tokens == 32
    assert_pools_full(sched)


def test_a_hit_followed_by_chunked_prefill_gives_the_cold_tokens():
    """After a hit the rest of the prompt must prefill in capped chunks from h, with the
    cold run's tokens."""
    kw = dict(max_num_batched_tokens=16, long_prefill_token_threshold=8)
    long_b = SHARED + prompt_ids(3, 30)
    want = cold_tokens({"b": (long_b, 8)}, **kw)
    sched = make_scheduler(**kw)
    mesh = make_mesh(sched)
    run(sched, mesh, make_req(sched, "a", A))
    b = make_req(sched, "b", long_b, 8)
    got = run(sched, mesh, b)
    assert tokens_of(got["b"]) == want["b"] and b.num_cached_tokens == 32
    starts = [c.start_pos for plan in mesh.plans for c in plan.partitions[0].prefills if c.req_id == b.req_id]
    assert starts == [32, 40, 48, 56, 64]
    assert_pools_full(sched)


def test_a_wrong_page_mapping_is_caught_by_the_fake_mesh():
    """The test harness itself: if a hit mapped another prefix's c4 page, the fake mesh
    must refuse to compute (so the tests above would fail on a mapping bug)."""
    sched = make_scheduler()
    mesh = make_mesh(sched)
    run(sched, mesh, make_req(sched, "a", A))
    c4 = sched.partitions[0].cache.pools[1]
    (b0, k0), (b1, k1) = sorted(c4.block_to_key.items())[:2]  # a's c4 pages 0 and 1
    c4.key_to_block[k0], c4.key_to_block[k1] = b1, b0  # swap pages 0 and 1
    c4.block_to_key[b0], c4.block_to_key[b1] = k1, k0
    with pytest.raises(AssertionError, match="c4 row"):
        run(sched, mesh, make_req(sched, "b", B))


@pytest.mark.parametrize(
    "spec_k,prompt_len,want", [(0, 16, 0), (0, 17, 16), (0, 33, 32), (7, 143, 0), (7, 144, 16), (7, 160, 32)]
)
def test_prompts_below_the_k_dependent_minimum_never_hit(spec_k, prompt_len, want):
    """A hit must be a multiple of 16 and at most prompt_len - max(1, replay) (replay 128
    at K=7), however much of the prompt is cached."""
    sched = make_scheduler(spec_k=spec_k, max_model_len=400, num_blocks=[64, 16])
    mesh = make_mesh(sched)
    tokens = prompt_ids(0, prompt_len)
    run(sched, mesh, make_req(sched, "a", tokens, 1))
    b = make_req(sched, "b", tokens, 1)
    got = run(sched, mesh, b)
    assert b.num_cached_tokens == want and got["b"][-1].num_cached_tokens == want
    assert_pools_full(sched)


def test_no_enable_prefix_caching_never_hits():
    """With prefix caching off nothing is keyed and a shared prompt is computed again."""
    sched = make_scheduler(enable_prefix_caching=False)
    mesh = make_mesh(sched)
    run(sched, mesh, make_req(sched, "a", A))
    b = make_req(sched, "b", B)
    got = run(sched, mesh, b)
    assert b.num_cached_tokens == 0 and got["b"][-1].num_cached_tokens == 0
    assert first_chunk(mesh, b.req_id) == (0, 49)
    assert all(not pool.key_to_block and not pool.lru_ids() for pool in sched.partitions[0].cache.pools)
    assert_pools_full(sched)


def test_k7_hit_with_drafts_gives_the_k0_cold_tokens():
    """At K=7 a hit must keep 128 tokens to replay (a 170-token prompt sharing 160 hits
    32 = (170 - 128) // 16 * 16), and verify steps on top of it must yield the K=0 cold
    tokens."""
    shared = prompt_ids(0, 160)
    pa, pb = shared + prompt_ids(1, 4), shared + prompt_ids(2, 10)
    want = cold_tokens({"a": (pa, 30), "b": (pb, 30)}, max_model_len=400)
    sched = make_scheduler(spec_k=7, max_model_len=400, num_blocks=[64, 32])
    mesh = make_mesh(sched)
    a, b = make_req(sched, "a", pa, 30), make_req(sched, "b", pb, 30)
    got = run(sched, mesh, a, ref=want)
    got.update(run(sched, mesh, b, ref=want))
    assert {k: tokens_of(v) for k, v in got.items()} == want
    assert b.num_cached_tokens == 32 and b.num_verify_steps > 0 and b.num_matched > 0
    assert_pools_full(sched)


def test_k7_verify_rows_past_the_committed_length_are_never_keyed():
    """Eager publish writes all 8 verify rows, but a page must be keyed only once
    num_computed (committed positions) passes its end: with every draft wrong, each step
    commits one token while rows run 7 positions ahead."""
    sched = make_scheduler(spec_k=7)
    mesh = make_mesh(sched)
    r = make_req(sched, "a", prompt_ids(0, 14), 12)
    sched.add(r)
    swa = sched.partitions[0].cache.pools[0]
    seen_verify = False
    while sched.has_work:
        step, _ = run_step(sched, mesh)
        d = step.plan.partitions[0].decode
        seen_verify |= d is not None and as_i8(d.num_rows).max() == 8
        if not r.finished:
            fp = r.pages[0]
            keyed = [n for n, b in enumerate(fp.block_ids, fp.first_page) if b in swa.block_to_key]
            aligned = r.num_computed // 16 * 16  # a hit is a multiple of 16: pages past it wait
            assert keyed == [n for n in range(fp.first_page, fp.end_page) if (n + 1) * 4 <= aligned]
            sched.partitions[r.partition].set_drafts(r, np.full(7, 2, np.int32))  # the fake model never predicts all 2s
    assert seen_verify and r.num_verify_steps > 0 and r.num_matched == 0
    assert_pools_full(sched)
