"""tools.bench.demo.serve_all with streams: n clients, each sending its requests back to back."""

from __future__ import annotations

import asyncio
import types

import pytest

from tools.bench import demo
from tools.bench.demo import serve_all


class FakeEngine:
    """Answers request i with [i, i]; records how many requests are in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.order: list[int] = []

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def generate(self, g):
        i = int(g)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.order.append(i)
        await asyncio.sleep(0.001 * (1 + i % 3))

        class Out:
            new_token_ids = [i, i]

        yield Out()
        self.in_flight -= 1


def test_each_client_sends_its_requests_one_after_another_and_outputs_keep_request_order():
    """With 3 streams, at most 3 requests are in flight, client c sends requests c, c+3, ...
    in that order, and the tokens come back in request order."""
    engine = FakeEngine()
    outs, per_user, total, _ = serve_all(engine, [str(i) for i in range(9)], streams=3)
    assert outs == [[i, i] for i in range(9)]
    assert engine.most == 3
    for c in range(3):
        mine = [i for i in engine.order if i % 3 == c]
        assert mine == [c, c + 3, c + 6]
    assert per_user > 0 and total > 0


def test_without_streams_every_request_is_sent_at_once():
    engine = FakeEngine()
    outs, _, _, _ = serve_all(engine, [str(i) for i in range(5)])
    assert outs == [[i, i] for i in range(5)] and engine.most == 5


STEP_S = 0.005


class StepClock:
    """serve_all's clock (its perf_counter) in engine steps: it moves STEP_S once every
    request in flight waits for its next step (one step serves them all, as an engine's
    batch does). No real sleep, so no load on the machine can skew the rates."""

    def __init__(self) -> None:
        self.steps = 0
        self.waiting: list[asyncio.Future] = []

    def perf_counter(self) -> float:
        return self.steps * STEP_S

    async def step(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        await fut

    async def run(self) -> None:
        while True:
            # NOTE: a woken request reaches its next step (or its client the next request's
            # first) within a loop iteration or two; ten leave every one of them waiting
            for _ in range(10):
                await asyncio.sleep(0)
            if self.waiting:
                self.steps += 1
                woken, self.waiting = self.waiting, []
                for fut in woken:
                    fut.set_result(None)


class StaggeredEngine(FakeEngine):
    """An even request takes 1 step, an odd one 6; one token per step (steps on a StepClock)."""

    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self.clock = clock

    def start(self) -> None:
        self.ticking = asyncio.get_running_loop().create_task(self.clock.run())

    async def stop(self) -> None:
        self.ticking.cancel()

    async def generate(self, g):
        i = int(g)
        for _ in range(1 if i % 2 == 0 else 6):
            await self.clock.step()

            class Out:
                new_token_ids = [i]

            yield Out()


def serve_on_steps(monkeypatch, num_requests: int, streams: int | None):
    clock = StepClock()
    monkeypatch.setattr(demo, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    return serve_all(StaggeredEngine(clock), [str(i) for i in range(num_requests)], streams=streams)


def test_steady_counts_the_tokens_received_until_the_first_client_is_done(monkeypatch):
    """Two clients: client 0 (requests 0, 2) is done after 2 steps with 2 tokens, when
    client 1 (1, 3: 12 steps) has 1 or 2 of its 12 (its second comes in the same step):
    steady is 3 or 4 tokens / 2 steps, total 14 tokens / 12 steps. Without streams, or
    with one, steady is total."""
    served = serve_on_steps(monkeypatch, 4, streams=2)
    assert served.outputs == [[0], [1] * 6, [2], [3] * 6]
    assert served.total_tok_s == pytest.approx(14 / (12 * STEP_S))
    # the ramp-down is left out
    assert served.steady_tok_s * 2 * STEP_S in (pytest.approx(3), pytest.approx(4))
    alone = serve_on_steps(monkeypatch, 3, streams=1)
    assert alone.steady_tok_s == alone.total_tok_s
    batch = serve_on_steps(monkeypatch, 3, streams=None)
    assert batch.steady_tok_s == batch.total_tok_s
