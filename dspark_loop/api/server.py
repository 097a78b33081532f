"""serve: run an aiohttp app until `stop` is set (by SIGINT/SIGTERM, or by `on_signal`,
which then decides: drain.py drains first), then shut down cleanly.

Handler cancellation is on: a client that disconnects cancels its handler, which closes
the engine generator and so aborts the request at once, even before the next token.
On a signal, `before_cleanup` (the engine's stop) runs while connections are still open,
so every open stream ends with an error event and [DONE] instead of being cut off.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

log = logging.getLogger(__name__)


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    stop: asyncio.Event | None = None,
    started: asyncio.Event | None = None,
    shutdown_timeout_s: float = 10.0,
    before_cleanup=None,
    on_signal=None,
) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal or (lambda _sig: stop.set()), sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout_s)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        log.info("serving on %s", ", ".join(f"http://{a[0]}:{a[1]}" for a in runner.addresses))
        if started is not None:
            started.set()
        await stop.wait()
        log.info("shutting down the HTTP server")
        if before_cleanup is not None:
            await before_cleanup()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        await runner.cleanup()
