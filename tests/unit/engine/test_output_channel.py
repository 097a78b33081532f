"""OutputChannel: a request's deliveries from the engine loop to its consumer."""

import asyncio

from dspark_loop.engine.output_channel import OutputChannel, deliver, merge_outputs
from dspark_loop.engine.outputs import RequestOutput, TokenLogprob


def delta(tokens, text, n_out, **kw):
    return RequestOutput("r", tokens, text, num_prompt_tokens=3, num_output_tokens=n_out, **kw)


async def test_a_waiting_consumer_gets_each_delta_as_it_is_put():
    """A consumer that keeps up must get every put as its own delta, unchanged."""
    ch = OutputChannel()
    first = delta([5], "a", 1)
    task = asyncio.ensure_future(ch.take())
    await asyncio.sleep(0)
    assert not task.done()
    ch.put(first)
    assert await task is first


async def test_a_consumer_that_fell_behind_gets_one_merged_delta():
    """Deltas put while the consumer was busy must come as one: tokens, text and logprobs
    concatenated in order; totals and the finish from the last."""
    ch = OutputChannel()
    lp = [TokenLogprob(5, -0.1), TokenLogprob(6, -0.2), TokenLogprob(7, -0.3)]
    ch.put(delta([5], "a", 1, logprobs=lp[:1], prompt_logprobs=[TokenLogprob(1, None)]))
    ch.put(delta([6, 7], "bc", 3, logprobs=lp[1:]))
    ch.put(delta([8], "d", 4, finished=True, finish_reason="length", logprobs=[]))
    out = await ch.take()
    assert out.new_token_ids == [5, 6, 7, 8] and out.new_text == "abcd"
    assert out.finished and out.finish_reason == "length" and out.num_output_tokens == 4
    assert out.logprobs == lp and out.prompt_logprobs == [TokenLogprob(1, None)]


def test_merging_deltas_without_logprobs_keeps_them_none():
    """A request that asked no logprobs must not get an empty logprob list by merging."""
    out = merge_outputs([delta([1], "x", 1), delta([2], "y", 2)])
    assert out.logprobs is None and out.prompt_logprobs is None and out.new_text == "xy"


async def test_a_paced_channel_wakes_its_consumer_at_the_first_token_then_every_n_tokens():
    """With interval 3 the first delta must be taken at once; after it the consumer must
    wait until 3 tokens have arrived (one delivery of several counts them all) or the
    request finished, and get them merged."""
    ch = OutputChannel(3)
    deliver({"r": ch}, [delta([1], "a", 1)])
    assert (await ch.take()).new_token_ids == [1]
    task = asyncio.ensure_future(ch.take())
    channels = {"r": ch}
    deliver(channels, [delta([2], "b", 2)])
    deliver(channels, [delta([3], "c", 3)])
    await asyncio.sleep(0)
    assert not task.done()
    deliver(channels, [delta([4, 5], "de", 5)])
    out = await task
    assert (out.new_token_ids, out.new_text, out.num_output_tokens) == ([2, 3, 4, 5], "bcde", 5)
    task = asyncio.ensure_future(ch.take())
    deliver(channels, [delta([6], "f", 6, finished=True, finish_reason="length")])
    out = await task
    assert (out.new_token_ids, out.finished, channels) == ([6], True, {})


async def test_a_paced_channel_hands_over_what_is_due_to_a_consumer_that_comes_late():
    """A consumer that calls take() after enough tokens arrived must not wait; one that
    comes before must, even though deltas are queued."""
    ch = OutputChannel(2)
    ch.put(delta([1], "a", 1))
    assert (await ch.take()).new_text == "a"
    ch.put(delta([2], "b", 2))
    task = asyncio.ensure_future(ch.take())
    await asyncio.sleep(0)
    assert not task.done()
    ch.put(delta([3], "c", 3))
    assert (await task).new_text == "bc"
    ch.put(delta([4, 5, 6], "def", 6))
    assert (await ch.take()).new_token_ids == [4, 5, 6]
