"""PendingEngine: the engine the HTTP app holds until the ranks are up."""

from __future__ import annotations

from dspark_loop.engine.outputs import GenerateRequest, RequestOutput, SamplingParams
from dspark_loop.pending_engine import PendingEngine


class Inner:
    def generate(self, g: GenerateRequest):
        async def deltas():
            yield RequestOutput(g.request_id, [1], "a")
            yield RequestOutput(g.request_id, [2], "b", finished=True, finish_reason="length")

        return deltas()


async def collect(gen) -> list[RequestOutput]:
    return [out async for out in gen]


async def test_before_the_ranks_are_up_a_request_ends_at_once_with_the_reason():
    """Until the engine exists, generate() must give one finished error delta naming why."""
    pending = PendingEngine(max_model_len=64)
    g = GenerateRequest("r1", [5, 6, 7], SamplingParams(max_tokens=4))
    [out] = await collect(pending.generate(g))
    assert (out.finished, out.finish_reason, out.num_prompt_tokens) == (True, "error", 3)
    assert "starting" in out.error
    pending.start_error = "ranks failed to start: boom"
    [out] = await collect(pending.generate(g))
    assert out.error == "ranks failed to start: boom"


async def test_once_the_engine_is_up_its_deltas_pass_through_unchanged():
    """With the engine set, generate() must give exactly the engine's deltas."""
    pending = PendingEngine(max_model_len=64)
    pending.inner = Inner()  # type: ignore[assignment]
    outs = await collect(pending.generate(GenerateRequest("r2", [5], SamplingParams(max_tokens=2))))
    assert [(o.new_token_ids, o.new_text, o.finished) for o in outs] == [([1], "a", False), ([2], "b", True)]
