"""EngineLoop end to end with the fake mesh under asyncio."""

import asyncio

import pytest

from dspark_loop.api.offline import collect, generate_all
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.engine.factories import make_mesh, make_scheduler, prompt_ids


class Recorder(EngineObserver):
    def __init__(self):
        self.traces, self.finished = [], []

    def on_step(self, trace):
        self.traces.append(trace)

    def on_request_finished(self, stats):
        self.finished.append(stats)


def gen_request(i, prompt_len=8, max_tokens=6, **params):
    return GenerateRequest(f"r{i}", prompt_ids(i, prompt_len), SamplingParams(max_tokens=max_tokens, **params))


@pytest.fixture(params=[False, True], ids=["lockstep", "async"])
async def engine(request):
    sched = make_scheduler(num_partitions=2, max_num_seqs=8)
    mesh = make_mesh(sched)
    rec = Recorder()
    loop = EngineLoop(sched, mesh, tiny_tokenizer(), [rec], async_scheduling=request.param)
    loop.start()
    loop.recorder = rec
    yield loop
    await loop.stop()


async def test_many_concurrent_requests_all_finish_with_their_own_tokens(engine):
    """Every generate() must stream its own deltas to a finished output; observers must
    see every step and every finished request; the pools must be full afterwards."""
    outs = await asyncio.gather(*(collect(engine, gen_request(i, max_tokens=5 + i % 3)) for i in range(20)))
    for i, o in enumerate(outs):
        assert o[-1].finished and o[-1].finish_reason == "length"
        assert sum(len(x.new_token_ids) for x in o) == 5 + i % 3 == o[-1].num_output_tokens
        assert all(x.request_id == f"r{i}" for x in o)
    assert sorted(s.request_id for s in engine.recorder.finished) == sorted(f"r{i}" for i in range(20))
    assert engine.recorder.traces and engine.num_running == 0 and engine.num_waiting == 0
    engine.scheduler.check_integrity()
    assert all(p.cache.usage() == 0 for p in engine.scheduler.partitions)


async def test_a_consumer_that_goes_away_aborts_its_request(engine):
    """Closing the generator early must abort the request and free its pages at once."""
    gen = engine.generate(gen_request(0, max_tokens=200))
    first = await gen.__anext__()
    assert not first.finished and engine.num_running == 1
    await gen.aclose()
    assert engine.num_running == 0 and engine.scheduler.kv_cache_usage() == 0


async def test_a_cancelled_consumer_task_aborts_its_request(engine):
    """Cancelling the task that iterates generate() must abort the request."""
    engine.mesh.delay_s = 0.001
    started = asyncio.Event()

    async def consume():
        async for _ in engine.generate(gen_request(0, max_tokens=200)):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.num_running == 0 and engine.scheduler.kv_cache_usage() == 0
    # the engine keeps serving
    assert (await collect(engine, gen_request(1)))[-1].finish_reason == "length"


async def test_a_dead_mesh_fails_every_request_with_error(engine):
    """EngineDead from the mesh must end all in-flight requests with "error", mark the
    engine dead, and make later generate() calls fail at once."""
    engine.mesh.fail_at_step = 3
    outs = await asyncio.gather(*(collect(engine, gen_request(i, max_tokens=50)) for i in range(5)))
    assert all(o[-1].finish_reason == "error" and "stopped answering" in o[-1].error for o in outs)
    assert not engine.ready and "stopped answering" in engine.dead_reason
    late = await collect(engine, gen_request(9))
    assert len(late) == 1 and late[0].finish_reason == "error"


async def test_a_prompt_longer_than_the_context_yields_an_error_output(engine):
    """A request that can never fit must get one error output, not an exception."""
    outs = await collect(engine, gen_request(0, prompt_len=engine.max_model_len))
    assert len(outs) == 1 and outs[0].finish_reason == "error" and engine.ready


async def test_generate_all_returns_each_requests_outputs(engine):
    """generate_all must return one output list per request, in request order."""
    res = await generate_all(engine, [gen_request(i, max_tokens=3) for i in range(3)])
    assert [r[-1].request_id for r in res] == ["r0", "r1", "r2"]
    assert [r[-1].num_output_tokens for r in res] == [3, 3, 3]


async def test_a_consumer_that_falls_behind_reads_the_same_tokens_and_text(engine):
    """A consumer that reads only after the request finished must get the same tokens and
    the same text as one that read every step (its deltas arrive merged)."""
    prompt = prompt_ids(3, 8)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    steady = await collect(engine, GenerateRequest("steady", prompt, params))
    gen = engine.generate(GenerateRequest("late", prompt, params))
    first = await gen.__anext__()
    while engine.num_running:
        await asyncio.sleep(0.01)
    rest = [o async for o in gen]
    late = [first, *rest]
    assert len(late) < len(steady)
    assert [t for o in late for t in o.new_token_ids] == [t for o in steady for t in o.new_token_ids]
    text = "".join(o.new_text for o in steady)
    assert text and "".join(o.new_text for o in late) == text
    assert late[-1].finished and late[-1].num_output_tokens == 12


async def test_consumers_and_observers_run_while_the_mesh_computes_the_next_step(engine):
    """The loop must send step N+1 before step N's consumers and observers run (SSE writes,
    metrics and the tap overlap the ranks' compute): every delta and trace but the last must
    reach them while a step is in flight."""
    mesh = engine.mesh
    mesh.delay_s = 0.005
    inner, in_flight = mesh.step, []

    async def step(plan):
        in_flight.append(plan.step_id)
        try:
            return await inner(plan)
        finally:
            in_flight.remove(plan.step_id)

    mesh.step = step
    traced = []

    class Probe(EngineObserver):
        def on_step(self, trace):
            traced.append(bool(in_flight))

    engine.observers.append(Probe())
    seen = []
    async for out in engine.generate(gen_request(0, max_tokens=8)):
        seen.append((out.finished, bool(in_flight)))
    assert len(seen) >= 4 and seen[-1][0]
    assert all(flying for finished, flying in seen[:-1]), seen
    # observers (metrics, the tap) too: every step's trace but the last while one is in flight
    assert len(traced) >= 4 and all(traced[:-1])
