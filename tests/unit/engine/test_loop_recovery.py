"""Recovery from a dead mesh: the running requests fail, the waiting ones survive the
restart and finish with the tokens a clean run gives; a spent budget leaves it dead."""

import asyncio

import pytest

from dspark_loop.api.offline import collect
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.mesh.restart_budget import RestartBudget
from dspark_loop.mesh.supervisor import MeshSupervisor
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.engine.factories import allowed_tokens, make_mesh, make_scheduler, prompt_ids
from tests.unit.engine.fake_mesh import FakeMesh

NUM_BLOCKS = [32, 16]


@pytest.fixture(params=[False, True], ids=["lockstep", "async"])
def overlap(request) -> bool:
    """Async scheduling off and on: a death with two steps in flight must behave the same."""
    return request.param


def requests(n: int, max_tokens: int = 6) -> list[GenerateRequest]:
    return [GenerateRequest(f"r{i}", prompt_ids(i, 8), SamplingParams(max_tokens=max_tokens)) for i in range(n)]


async def clean_tokens(n: int) -> dict[str, list[int]]:
    sched = make_scheduler(max_num_seqs=2)
    engine = EngineLoop(sched, make_mesh(sched), tiny_tokenizer())
    engine.start()
    outs = await asyncio.gather(*(collect(engine, g) for g in requests(n)))
    await engine.stop()
    return {o[-1].request_id: [t for x in o for t in x.new_token_ids] for o in outs}


async def test_running_requests_fail_and_waiting_ones_finish_after_the_restart(overlap):
    """With 2 slots and 5 requests, a death at step 4 must end the 2 running requests with
    an error naming the ranks, report restarting (not dead, not ready) until resume(), and
    finish the 3 waiting ones with exactly the tokens of a run without the death, on a
    fresh scheduler whose pools end full."""
    want = await clean_tokens(5)
    sched = make_scheduler(max_num_seqs=2)
    mesh = make_mesh(sched)
    mesh.fail_at_step = 4
    engine = EngineLoop(sched, mesh, tiny_tokenizer(), async_scheduling=overlap)
    seen = {}

    async def restart(reason: str, num_failed: int) -> None:
        seen.update(
            reason=reason,
            num_failed=num_failed,
            restarting=engine.restarting,
            ready=engine.ready,
            dead=engine.dead_reason,
            waiting=engine.num_waiting,
        )
        fresh = make_scheduler(max_num_seqs=2)
        engine.resume(make_mesh(fresh), fresh)

    engine.on_mesh_dead = restart
    engine.start()
    outs = await asyncio.wait_for(asyncio.gather(*(collect(engine, g) for g in requests(5))), 60)
    assert seen == {
        "reason": "rank 0 stopped answering",
        "num_failed": 2,
        "restarting": "rank 0 stopped answering",
        "ready": False,
        "dead": None,
        "waiting": 3,
    }
    for o in outs[:2]:
        assert o[-1].finish_reason == "error" and "the ranks failed" in o[-1].error
    for o in outs[2:]:
        rid = o[-1].request_id
        assert o[-1].finish_reason == "length"
        assert [t for x in o for t in x.new_token_ids] == want[rid]
    assert engine.ready and engine.scheduler is not sched
    assert engine.scheduler.kv_cache_usage() == 0
    await engine.stop()


async def test_giving_up_ends_the_kept_requests_and_leaves_the_engine_dead(overlap):
    """When no restart comes, give_up() must end every kept request with the reason and
    make the engine dead (later requests fail at once)."""
    sched = make_scheduler(max_num_seqs=1)
    mesh = make_mesh(sched)
    mesh.fail_at_step = 2
    engine = EngineLoop(sched, mesh, tiny_tokenizer(), async_scheduling=overlap)

    async def no_restart(reason: str, num_failed: int) -> None:
        engine.give_up(f"{reason}; not restarting")

    engine.on_mesh_dead = no_restart
    engine.start()
    outs = await asyncio.gather(*(collect(engine, g) for g in requests(3)))
    assert all(o[-1].finish_reason == "error" for o in outs)
    assert engine.dead_reason == "rank 0 stopped answering; not restarting"
    assert engine.restarting is None and not engine.ready
    late = await collect(engine, requests(1)[0])
    assert late[-1].finish_reason == "error"


async def test_a_mesh_that_dies_while_idle_is_restarted_without_a_request(overlap):
    """A death noticed between requests must show as restarting at once and trigger the
    restart from the idle loop."""
    sched = make_scheduler()
    mesh = make_mesh(sched)
    engine = EngineLoop(sched, mesh, tiny_tokenizer(), async_scheduling=overlap)
    called = asyncio.Event()

    async def restart(reason: str, num_failed: int) -> None:
        called.set()

    engine.on_mesh_dead = restart
    engine.start()
    await asyncio.sleep(0)
    mesh.dead = "rank 1 exited with signal SIGKILL"
    assert engine.restarting == mesh.dead and engine.dead_reason is None and not engine.ready
    await asyncio.wait_for(called.wait(), 5)
    await engine.stop()


class StartableMesh(FakeMesh):
    """The fake mesh with the lifecycle the supervisor drives."""

    made: list = []

    def __init__(self):
        super().__init__(make_scheduler().layout, 1, allowed_tokens())
        self.num_blocks = list(NUM_BLOCKS)
        self.closed = False
        StartableMesh.made.append(self)

    async def start(self) -> None:
        pass

    async def close(self, grace_s: float = 5.0) -> None:
        self.closed = True


class Restarts(EngineObserver):
    def __init__(self):
        self.events = []

    def on_mesh_restart(self, event):
        self.events.append(event)


async def test_the_supervisor_restarts_within_its_budget_then_gives_up():
    """With --max-rank-restarts 1: the first death must give a fresh mesh and scheduler
    (old mesh closed, a MeshRestart to observers), the second must leave the engine dead
    saying the budget is spent."""
    StartableMesh.made = []
    rec = Restarts()
    sup = MeshSupervisor(
        StartableMesh, lambda nb: make_scheduler(num_blocks=nb), tiny_tokenizer(), [rec], RestartBudget(1, window_s=600)
    )
    engine = await sup.start()
    first = StartableMesh.made[0]
    first.fail_at_step = 1
    outs = await collect(engine, requests(1, max_tokens=8)[0])
    assert outs[-1].finish_reason == "error"
    while engine.restarting is not None:
        await asyncio.sleep(0.01)
    assert first.closed and engine.mesh is StartableMesh.made[1] and engine.ready
    assert [(e.num_restarts, e.num_failed, e.num_kept) for e in rec.events] == [(1, 1, 0)]
    assert (await collect(engine, requests(2)[1]))[-1].finish_reason == "length"
    StartableMesh.made[1].fail_at_step = 0
    await collect(engine, requests(3)[2])
    while engine.restarting is not None:
        await asyncio.sleep(0.01)
    assert "--max-rank-restarts" in engine.dead_reason and len(StartableMesh.made) == 2
    await sup.close()
