"""Async scheduling (pipeline depth 2) over the checking fake mesh: the same tokens as
lockstep under random finishes, aborts and preemptions while two steps are in flight."""

import asyncio
import random

import pytest

from dspark_loop.contract.placeholders import PLACEHOLDER
from dspark_loop.contract.protocol import as_i32, pack_mask
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.tiny_tokenizer import eos_id, tiny_tokenizer
from tests.unit.engine.factories import make_mesh, make_scheduler, prompt_ids

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


async def run(seed: int, overlap: bool, abort_after: dict[str, int]):
    # NOTE: few pages for 14 requests: partitions run dry and preempt while steps fly
    sched = make_scheduler(num_partitions=2, max_num_seqs=8, num_blocks=[16, 8], max_num_batched_tokens=32)
    mesh = make_mesh(sched, eos_script(seed))
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
    for g in reqs:
        rid = g.request_id
        if rid in abort_after and rid not in reasons:
            assert got[rid] == want[rid][: len(got[rid])], rid
        else:
            assert (got[rid], reasons[rid]) == (want[rid], want_reasons[rid]), rid
    placeholders = sum(
        int((as_i32(p.decode.token_ids) == PLACEHOLDER).sum()) for plan in plans for p in plan.partitions if p.decode
    )
    assert placeholders > 0  # the overlap was exercised
    if seed == 0:
        assert num_preemptions > 0  # the workload preempts (checked once: it is deterministic per seed)


async def test_a_request_with_a_grammar_constraint_sits_out_the_overlapped_step():
    """A constrained request's mask needs its last token: it must never get a placeholder
    input, and must still finish with the tokens lockstep gives it."""

    class AllowAll:
        def row_masks(self, output_ids, drafts=()):
            import numpy as np

            return [pack_mask(np.ones(tiny_tokenizer().get_vocab_size(), bool))]

    async def tokens(overlap: bool):
        sched = make_scheduler(num_partitions=1, max_num_seqs=4)
        mesh = make_mesh(sched)
        engine = EngineLoop(sched, mesh, tiny_tokenizer(), async_scheduling=overlap)
        engine.start()
        out = {}

        async def one(i: int, constrained: bool):
            g = GenerateRequest(f"r{i}", prompt_ids(i, 6), SamplingParams(max_tokens=12, ignore_eos=True))
            if constrained:
                g.constraint = AllowAll()
            out[g.request_id] = [t async for o in engine.generate(g) for t in o.new_token_ids]

        await asyncio.gather(*(one(i, i == 0) for i in range(3)))
        await engine.stop()
        return out, mesh.plans

    want, _ = await tokens(False)
    got, plans = await tokens(True)
    assert got == want
    for plan in plans:
        part = plan.partitions[0]
        masked = {m.req_id for m in part.token_masks}
        if part.decode is not None and masked:
            ids, toks = as_i32(part.decode.req_ids), as_i32(part.decode.token_ids)
            assert not any(t == PLACEHOLDER for r, t in zip(ids, toks) if r in masked)
