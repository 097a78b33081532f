"""The event loop the server runs on: uvloop where it is installed (`--loop auto`, the
default), else asyncio's own.

uvloop (libuv, C) makes the loop's per-callback work cheaper: waking a request's consumer
at every step, aiohttp's socket writes, ZeroMQ readiness. At the production tile (256
requests x 8 rows) it halves the engine's delivery time (tools/bench/host --loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine

EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(kind: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """kind: auto (uvloop if importable), uvloop (ValueError when it is not), asyncio."""
    if kind not in EVENT_LOOPS:
        raise ValueError(f"unknown event loop {kind!r}; choose one of {', '.join(EVENT_LOOPS)}")
    if kind == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if kind == "uvloop":
            raise ValueError("uvloop is not installed (pip install uvloop), or use --loop asyncio") from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine, kind: str = "auto"):
    """asyncio.run(main) on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(main)
