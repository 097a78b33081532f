"""Pages: exact ids, ring release, preemption by recompute, abort."""

from dspark_loop.contract.protocol import as_i32
from tests.unit.engine.factories import make_mesh, make_requests, make_scheduler, run_step, run_to_completion


def block_updates(step, p=0):
    return [
        (u.req_id, u.family, u.first_page, as_i32(u.block_ids).tolist()) for u in step.plan.partitions[p].block_updates
    ]


def test_ring_pages_leave_the_window_and_are_reused():
    """With window 8 and 4-token swa pages, page 0 must be released by the first schedule
    after position 10 is computed, before it maps anything, and its block must be the one
    that maps page 4 later on."""
    sched = make_scheduler(num_blocks=[4, 4], enable_prefix_caching=False)  # no LRU
    mesh = make_mesh(sched)
    (r,) = make_requests(sched, 1, prompt_len=8, max_tokens=12)
    sched.add(r)
    step, _ = run_step(sched, mesh)
    # prompt positions 0..7: swa pages 0,1 -> blocks 0,1; c4 rows 0,1 -> c4 page 0
    assert block_updates(step) == [(0, 0, 0, [0, 1]), (0, 1, 0, [0])]
    free = sched.partitions[0].cache.pools[0]
    step, _ = run_step(sched, mesh)  # writes position 8: swa page 2
    assert block_updates(step) == [(0, 0, 2, [2])]
    run_step(sched, mesh)  # position 9
    assert r.pages[0].first_page == 0 and free.num_free == 1
    run_step(sched, mesh)  # position 10 -> next write 11 reads back to 4: page 0 is dead
    assert r.pages[0].first_page == 0  # ...and goes back with the next schedule
    step = sched.schedule()  # position 11
    assert r.pages[0].first_page == 1 and free.free_ids() == [3, 0]
    sched.update(step, mesh.run(step.plan))
    step, _ = run_step(sched, mesh)  # position 12: page 3 -> block 3
    assert block_updates(step) == [(0, 0, 3, [3])]
    for _ in range(4):
        step, _ = run_step(sched, mesh)  # 13, 14, 15 (page 1 released), then 16
    assert block_updates(step) == [(0, 0, 4, [0])]  # block 0 again, for page 4
    run_to_completion(sched, mesh)
    assert r.finish_reason == "length" and len(r.output_ids) == 12


def test_preemption_takes_the_newest_request_and_it_resumes_with_identical_tokens():
    """When c4 pages run out the newest running request must be preempted by recompute,
    back at the front of the queue; every request must still produce exactly the tokens
    of an unconstrained run."""

    def run(num_c4_blocks):
        sched = make_scheduler(num_blocks=[32, num_c4_blocks])
        mesh = make_mesh(sched)
        reqs = make_requests(sched, 3, prompt_len=8, max_tokens=40)
        for r in reqs:
            sched.add(r)
        got = {r.request_id: [] for r in reqs}
        preempted = []
        for _ in range(300):
            if not sched.has_work:
                break
            step, outs = run_step(sched, mesh)
            names = {r.req_id: r.request_id for r in reqs}
            preempted += [names[i] for i in step.preempted_req_ids]
            for o in outs:
                got[o.request_id] += o.new_token_ids
            sched.check_integrity()
            if step.preempted_req_ids:
                head = sched.partitions[0].waiting[0]
                assert head.request_id == preempted[-1]
        return got, preempted, reqs

    want, none, _ = run(16)
    assert none == []
    got, preempted, reqs = run(5)
    # each request needs 3 c4 pages by the end (48 tokens); 5 pages hold one request and
    # a half: req-2 goes first (at position 16), then req-1 (at position 32)
    assert preempted[:2] == ["req-2", "req-1"]
    assert got == want
    assert all(len(v) == 40 for v in got.values())
    assert [r.num_preemptions > 0 for r in reqs] == [False, True, True]


def test_abort_frees_pages_at_once_and_tells_the_ranks_next_step():
    """abort() must return a running request's pages before it returns and put its id in
    the next plan's freed_req_ids; aborting everything must leave the pools full."""
    sched = make_scheduler()
    mesh = make_mesh(sched)
    reqs = make_requests(sched, 3, prompt_len=8)
    for r in reqs:
        sched.add(r)
    run_step(sched, mesh)
    cache = sched.partitions[0].cache
    before = cache.num_free()
    assert sched.abort("req-1") is True
    assert cache.num_free() == [before[0] + 2, before[1] + 1]
    assert sched.abort("req-1") is False and sched.abort("nope") is False
    step, _ = run_step(sched, mesh)
    assert step.plan.partitions[0].freed_req_ids == [1]
    assert step.aborted_req_ids == [1]
    sched.abort("req-0")
    sched.abort("req-2")
    assert cache.num_free() == [32, 16] and not sched.has_work
    sched.check_integrity()


def test_aborting_a_request_while_its_step_runs_drops_its_results():
    """A request aborted between schedule() and update() must get no output and its
    pages must not be touched again by update()."""
    sched = make_scheduler()
    mesh = make_mesh(sched)
    reqs = make_requests(sched, 2, prompt_len=8)
    for r in reqs:
        sched.add(r)
    step = sched.schedule()
    results = mesh.run(step.plan)
    sched.abort("req-0")
    outs = sched.update(step, results)
    assert [o.request_id for o in outs] == ["req-1"]
    assert [r.request_id for r in step.finished] == ["req-0"]
    sched.check_integrity()


def test_a_request_that_can_never_fit_fails_with_an_error():
    """A request whose first chunk needs more pages than an empty partition has must
    finish with "error" instead of waiting forever."""
    sched = make_scheduler(num_blocks=[2, 4])
    mesh = make_mesh(sched)
    (r,) = make_requests(sched, 1, prompt_len=20)
    sched.add(r)
    outs = run_to_completion(sched, mesh)["req-0"]
    assert outs[-1].finish_reason == "error" and "pages" in outs[-1].error
