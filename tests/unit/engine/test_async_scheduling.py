"""Async scheduling (pipeline depth 2) over the checking fake mesh: the same tokens as
lockstep under random finishes, aborts and preemptions while two steps are in flight."""

import asyncio
import random

import numpy as np
import pytest

from dspark_loop.contract.placeholders import PLACEHOLDER
from dspark_loop.contract.protocol import as_i8, as_i32, pack_mask
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.tiny_tokenizer import eos_id, tiny_tokenizer
from tests.unit.engine.factories import allowed_tokens, make_mesh, make_scheduler, prompt_ids
from tests.unit.engine.random_policy import RandomPolicy

NUM_REQUESTS = 14


def workload(seed: int) -> tuple[list[GenerateRequest], dict[str, int]]:
    """Requests of random lengths and limits, and for some a delta count after which
    their consumer goes away (an abort at a random point of the pipeline)."""
    rng = random.Random(seed)
    reqs, abort_after = [], {}
    for i in range(NUM_REQUESTS):
        params = SamplingParams(max_tokens=rng.randint(1, 60), stop_token_ids=[rng.choice([5, 9, 17])])
        reqs.append(GenerateRequest(f"r{i}", prompt_ids(i + 31 * seed, rng.randint(2, 30)), params))
        if rng.random() < 0.3:
            abort_after[f"r{i}"] = rng.randint(1, 6)
    return reqs, abort_after


def eos_script(seed: int):
    """The fake model ends some requests early with EOS, at positions no one plans for."""

    def script(tok: int, prev: int, pos: int):
        return eos_id() if (tok * 13 + prev * 7 + pos + seed) % 41 == 0 else None

    return script


def assert_lockstep_tokens(reqs, abort_after, got, want) -> None:
    """got, want: (tokens, finish reasons) by request id. Every request must have lockstep's
    tokens and finish reason; one aborted before finishing, a prefix of its tokens."""
    (tokens, reasons), (want_tokens, want_reasons) = got, want
    for g in reqs:
        rid = g.request_id
        if rid in abort_after and rid not in reasons:
            assert tokens[rid] == want_tokens[rid][: len(tokens[rid])], rid
        else:
            assert (tokens[rid], reasons[rid]) == (want_tokens[rid], want_reasons[rid]), rid


class OneWay:
    """A grammar that allows one token at each output index i (a different one each time), so
    a mask filled from stale outputs (before the step that sampled the last token was applied)
    gives a wrong token. Drafts are walked as the real grammar walks them."""

    def __init__(self) -> None:
        self.vocab = tiny_tokenizer().get_vocab_size()

    @staticmethod
    def token(i: int) -> int:
        ok = allowed_tokens()
        return ok[(5 * i + 1) % len(ok)]

    def row_masks(self, output_ids, drafts=()):
        n, masks = len(output_ids), []
        for i in range(len(drafts) + 1):
            only = np.zeros(self.vocab, bool)
            only[self.token(n + i)] = True
            masks.append(pack_mask(only))
            if i == len(drafts) or drafts[i] != self.token(n + i):
                break
        return masks


async def run(
    seed: int, overlap: bool, abort_after: dict[str, int], spec_k: int = 0, max_model_len: int = 256, policy=None
):
    # NOTE: few pages for 14 requests: partitions run dry and preempt while steps fly
    sched = make_scheduler(
        num_partitions=2,
        max_num_seqs=8,
        num_blocks=[16, 8],
        max_num_batched_tokens=32,
        spec_k=spec_k,
        max_model_len=max_model_len,
        **({} if policy is None else {"policy": policy}),
    )
    mesh = make_mesh(sched, eos_script(seed), drafts=bool(spec_k))
    engine = EngineLoop(sched, mesh, tiny_tokenizer(), async_scheduling=overlap)
    engine.start()
    reqs, _ = workload(seed)
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}

    async def one(g: GenerateRequest) -> None:
        got, n = [], 0
        gen = engine.generate(g)
        async for out in gen:
            got += out.new_token_ids
            n += 1
            if out.finished:
                reasons[g.request_id] = out.finish_reason
            elif abort_after.get(g.request_id) == n:
                break
        await gen.aclose()
        tokens[g.request_id] = got

    await asyncio.wait_for(asyncio.gather(*(one(g) for g in reqs)), 120)
    for _ in range(3):
        await asyncio.sleep(0)
    sched.check_integrity()
    assert all(p.cache.usage() == 0 for p in sched.partitions) and not sched.requests
    await engine.stop()
    return tokens, reasons, sched.num_preemptions, mesh.plans


@pytest.mark.parametrize("seed", range(8))
async def test_async_scheduling_gives_lockstep_tokens_under_random_finishes_aborts_and_preemptions(seed):
    """With two steps in flight, every request must get exactly the tokens (and finish
    reason) of a lockstep run; an aborted one a prefix of them. The fake mesh checks every
    page a row writes or reads, so a wasted row of a finished, aborted or preempted request
    that touched another request's pages would fail here; pools must end full."""
    reqs, abort_after = workload(seed)
    want, want_reasons, _, _ = await run(seed, False, {})
    got, reasons, num_preemptions, plans = await run(seed, True, abort_after)
    assert_lockstep_tokens(reqs, abort_after, (got, reasons), (want, want_reasons))
    placeholders = sum(
        int((as_i32(p.decode.token_ids) == PLACEHOLDER).sum()) for plan in plans for p in plan.partitions if p.decode
    )
    assert placeholders > 0  # the overlap was exercised
    if seed == 0:
        assert num_preemptions > 0  # the workload preempts (checked once: it is deterministic per seed)


@pytest.mark.parametrize("seed", range(8))
async def test_k7_overlap_gives_k0_tokens_under_random_finishes_aborts_and_preemptions(seed):
    """K=7 with two steps in flight: the ranks run their own acceptance of step N and fill
    the next window's start, row 0 and drafts; every request must still get exactly the
    K=0 lockstep tokens (an aborted one a prefix), with verifies accepting 1..8 tokens
    and windows that must start at a placeholder. A short context puts requests at the
    position ceiling (fallback rows, sitting out) too."""
    reqs, abort_after = workload(seed)
    want, want_reasons, _, _ = await run(seed, False, {}, max_model_len=64)
    lock, lock_reasons, _, _ = await run(seed, False, {}, spec_k=7, max_model_len=64)
    assert (lock, lock_reasons) == (want, want_reasons)
    got, reasons, num_preemptions, plans = await run(seed, True, abort_after, spec_k=7, max_model_len=64)
    assert_lockstep_tokens(reqs, abort_after, (got, reasons), (want, want_reasons))
    open_starts = sum(
        int((as_i32(p.decode.start_pos) == PLACEHOLDER).sum()) for plan in plans for p in plan.partitions if p.decode
    )
    assert open_starts > 0  # windows after an unanswered verify were planned


@pytest.mark.parametrize("seed", range(6))
async def test_k7_overlap_with_adaptive_windows_and_drafter_skips_gives_k0_tokens(seed):
    """Adaptive verification planned ahead: random verify lengths (0..7, ragged tiles) and
    drafter skips chosen from confidences one step stale; the ranks accept each ragged
    window themselves and a skipped pass leaves a 1-row step at the ranks' start. Every
    request must get exactly the K=0 lockstep tokens (an aborted one a prefix), and the
    policy must still be told each step's cost."""
    reqs, abort_after = workload(seed)
    want, want_reasons, _, _ = await run(seed, False, {}, max_model_len=64)
    policy = RandomPolicy(seed, p_draft=0.6)
    got, reasons, _, plans = await run(seed, True, abort_after, spec_k=7, max_model_len=64, policy=policy)
    assert_lockstep_tokens(reqs, abort_after, (got, reasons), (want, want_reasons))
    decodes = [p.decode for plan in plans for p in plan.partitions if p.decode]
    assert any((as_i32(d.start_pos) == PLACEHOLDER).any() for d in decodes)
    assert any(d.draft_mask for d in decodes)  # drafter skips were planned
    assert len({int(n) for d in decodes for n in as_i8(d.num_rows)}) > 3  # ragged windows
    assert len(policy.observed) >= len(plans) - 1  # it learns every gathered step's cost


async def constrained_run(spec_k: int, overlap: bool, max_draft_tokens: int = 7):
    """Request r0 under OneWay (12 tokens) next to two free ones (40, or 160 at K=7, where
    they accept several tokens a step and must outlive it): (tokens by request id, the plans)."""
    sched = make_scheduler(num_partitions=1, max_num_seqs=4, spec_k=spec_k, max_model_len=256)
    mesh = make_mesh(sched, drafts=bool(spec_k))
    engine = EngineLoop(sched, mesh, tiny_tokenizer(), async_scheduling=overlap)
    engine.start()
    out: dict[str, list[int]] = {}

    async def one(i: int, max_tokens: int, constrained: bool):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, max_draft_tokens=max_draft_tokens)
        g = GenerateRequest(f"r{i}", prompt_ids(i, 6), params)
        if constrained:
            g.constraint = OneWay()
        out[g.request_id] = [t async for o in engine.generate(g) for t in o.new_token_ids]

    free = 160 if spec_k else 40
    await asyncio.gather(one(0, 12, True), one(1, free, False), one(2, free, False))
    await engine.stop()
    return out, mesh.plans


def rows_of(plan, req_id: int) -> list[int] | None:
    """The request's decode row inputs in the plan (None: it has no decode rows there)."""
    d = plan.partitions[0].decode
    if d is None:
        return None
    ids, rows, toks = as_i32(d.req_ids).tolist(), as_i8(d.num_rows).tolist(), as_i32(d.token_ids).tolist()
    at = 0
    for r, n in zip(ids, rows):
        if r == req_id:
            return toks[at : at + n]
        at += n
    return None


@pytest.mark.parametrize("spec_k,max_draft_tokens", [(0, 7), (7, 0)], ids=["k0", "k7-speculation-off"])
async def test_a_one_row_constrained_request_runs_planned_ahead_with_masks_that_follow_the_plan(
    spec_k, max_draft_tokens
):
    """A constrained request without drafts (K=0, or K=7 with its speculation off) must
    run planned ahead in every step while it decodes (placeholder inputs), its masks
    following the plan and filled from its outputs including the step in flight's token:
    it must write exactly the grammar's tokens, and everyone lockstep's tokens."""
    want, _ = await constrained_run(spec_k, False, max_draft_tokens)
    got, plans = await constrained_run(spec_k, True, max_draft_tokens)
    assert got == want
    assert got["r0"] == [OneWay.token(i) for i in range(12)]
    masked = [p for p in plans if any(m for part in p.partitions for m in part.token_masks)]
    (rid,) = {m.req_id for p in masked for m in p.partitions[0].token_masks}
    with_it = [rows_of(p, rid) for p in plans]
    decoding = [i for i, r in enumerate(with_it) if r is not None]
    assert decoding == list(range(decoding[0], decoding[-1] + 1))  # every step while it decodes
    assert sum(with_it[i] == [PLACEHOLDER] for i in decoding) >= len(decoding) - 1  # planned ahead
    assert all(len(with_it[i]) == 1 for i in decoding)


async def test_while_a_constrained_request_drafts_the_loop_plans_in_lockstep():
    """At K=7 a constrained request that drafts verifies drafts its grammar must walk before
    the tile is built: its verify rows are never placeholders (the loop waits for the step
    in flight), it verifies in every step while it decodes, its tokens are the grammar's,
    and the free requests get lockstep's tokens; overlap resumes after it."""
    want, _ = await constrained_run(7, False)
    got, plans = await constrained_run(7, True)
    assert got == want
    assert got["r0"] == [OneWay.token(i) for i in range(12)]
    (rid,) = {m.req_id for p in plans for part in p.partitions for m in part.token_masks}
    with_it = [rows_of(p, rid) for p in plans]
    decoding = [i for i, r in enumerate(with_it) if r is not None]
    assert decoding == list(range(decoding[0], decoding[-1] + 1))
    assert all(PLACEHOLDER not in with_it[i] for i in decoding)
    assert any(len(with_it[i]) > 1 for i in decoding)  # it verifies
    after = [p.partitions[0].decode for p in plans[decoding[-1] + 1 :]]
    assert any(PLACEHOLDER in as_i32(d.start_pos) for d in after if d is not None)  # planned ahead again after it


async def test_k7_overlap_maps_pages_for_the_longest_outcome_and_no_further():
    """A verify planned while the previous one flies must map pages up to its longest
    outcome (the previous verify accepting all 8, then 8 rows): never more than 16
    positions past where the ranks actually start it, and the request must never sit out
    (one request, far from its limits)."""
    sched = make_scheduler(spec_k=7, max_model_len=512, num_blocks=[64, 32])
    mesh = make_mesh(sched, drafts=True)
    rank = mesh.runners[0]
    swa = sched.layout.families[0]
    mapped, reach, runs = [0], [], []
    run_resolved = rank.execute

    def spy(part):
        for u in part.block_updates:
            if u.family == 0:
                mapped[0] = max(mapped[0], (u.first_page + len(as_i32(u.block_ids))) * swa.tokens_per_page)
        if part.decode is not None:
            start = int(as_i32(part.decode.start_pos)[0])
            reach.append(mapped[0] - start)
        runs.append(part.decode is not None)
        return run_resolved(part)

    rank.execute = spy
    engine = EngineLoop(sched, mesh, tiny_tokenizer(), async_scheduling=True)
    engine.start()
    g = GenerateRequest("r", prompt_ids(1, 20), SamplingParams(max_tokens=120, ignore_eos=True))
    got = [t async for o in engine.generate(g) for t in o.new_token_ids]
    await engine.stop()
    assert len(got) == 120
    assert max(reach) <= 16 + swa.tokens_per_page  # pages are whole: up to one page of slack
    first_decode = runs.index(True)
    assert all(runs[first_decode : len(runs) - 3])  # no step without it until its last tokens


async def test_the_tap_shows_the_planned_and_the_reconciled_k7_step():
    """Each trace of a step planned ahead must say so and count what the plan left to the
    ranks (placeholder rows, open window starts); once read, the rows of requests that had
    ended meanwhile must be reported as wasted, only for requests that finished before;
    the replay summary must report them."""
    from dspark_loop.engine.observer import EngineObserver
    from tools.tap import summary

    class Recorder(EngineObserver):
        def __init__(self):
            self.traces = []

        def on_step(self, trace):
            self.traces.append(trace)

    sched = make_scheduler(spec_k=7, num_partitions=2, max_num_seqs=8, num_blocks=[64, 32])
    rec = Recorder()
    engine = EngineLoop(sched, make_mesh(sched, eos_script(3), drafts=True), tiny_tokenizer(), [rec], True)
    engine.start()

    async def one(i: int) -> None:
        g = GenerateRequest(f"r{i}", prompt_ids(i, 12), SamplingParams(max_tokens=100))
        async for _ in engine.generate(g):
            pass

    await asyncio.gather(*(one(i) for i in range(8)))
    await engine.stop()
    await asyncio.sleep(0)
    ahead = [t for t in rec.traces if t.overlapped]
    parts = [p for t in ahead for p in t.partitions]
    assert sum(p.num_placeholder_rows for p in parts) > 0 and sum(p.num_open_starts for p in parts) > 0
    finished_by: dict[int, int] = {}
    for t in rec.traces:
        for rid in t.finished_req_ids:
            finished_by.setdefault(rid, t.step_id)
    wasted = [(t.step_id, rid) for t in ahead for p in t.partitions for rid in p.wasted_req_ids]
    assert wasted and all(finished_by[rid] < sid for sid, rid in wasted)
    assert sum(p.num_wasted_rows for p in parts) >= len(wasted)
    assert "wasted rows" in summary(rec.traces)
