"""--stream-interval N: a stream's client gets a chunk every N tokens, and at the end.

The engine delivers a delta per step (one token per request at K=0). At hundreds of streams
the host's cost is per chunk: the chunk's JSON, the text parsers, one socket write. A stream
paced at N takes the engine's deltas until they hold at least N tokens or the request ends,
merged into one (engine/output_channel.merge_outputs: tokens, text and logprobs joined, the
finish from the last), so that work runs once per N tokens. As vLLM's flag of that name:
the first chunk still goes out at once (time to first token is unchanged), then every N
tokens or more (K=7 steps bring several), and the finishing one whatever its size. What a
client receives, joined, is the same at any N; only how it is cut into chunks changes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from dspark_loop.engine.output_channel import merge_outputs
from dspark_loop.engine.outputs import RequestOutput


async def next_delta(gen: AsyncIterator[RequestOutput], interval: int) -> RequestOutput | None:
    """The engine's next delta, or its next ones merged until they hold >= interval tokens or
    one finished; None when the engine's generator ended (with nothing pending)."""
    out = await anext(gen, None)
    if interval <= 1 or out is None or out.finished or len(out.new_token_ids) >= interval:
        return out
    items = [out]
    num_tokens = len(out.new_token_ids)
    while num_tokens < interval:
        more = await anext(gen, None)
        if more is None:  # ended without a finish: the caller's next call reports it
            break
        items.append(more)
        num_tokens += len(more.new_token_ids)
        if more.finished:
            break
    return items[0] if len(items) == 1 else merge_outputs(items)
