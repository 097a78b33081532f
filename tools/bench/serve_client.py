"""The serving benchmark's load: N concurrent streaming /v1/completions requests, sent at once
from this process (a separate one from the server, so the client's CPU is not the server's).

    python -m tools.bench.serve_client SPEC.json   -> one JSON object on stdout

SPEC: {"url": ..., "bodies": [request bodies], "timeout_s": ...}. Each stream records when
each chunk arrived and which token ids it carried; the answer holds, per stream, the token
ids, the time to its first token, the gaps between its chunks (a K=7 chunk carries several
tokens: the gap is what a reader sees) and any error, plus the wall time from the first send
to the last byte and this process's CPU seconds over that window.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import aiohttp

DATA = b"data: "
DONE = b"[DONE]"


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def one_stream(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    """A stream's record: token_ids, ttft_s, gaps_s (between chunks with tokens), error."""
    out: dict = {"token_ids": [], "ttft_s": None, "gaps_s": [], "total_s": 0.0, "error": None}
    sent = time.perf_counter()
    last = None
    try:
        async with session.post(url + "/v1/completions", json={**body, "stream": True}) as resp:
            if resp.status != 200:
                out["error"] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return out
            async for raw in resp.content:
                if not raw.startswith(DATA):
                    continue
                payload = raw[len(DATA) :].strip()
                if payload == DONE:
                    break
                event = json.loads(payload)
                if "error" in event:
                    out["error"] = str(event["error"])[:200]
                    continue
                ids = [t for c in event.get("choices", ()) for t in c.get("token_ids") or ()]
                if not ids:
                    continue
                now = time.perf_counter()
                if last is None:
                    out["ttft_s"] = now - sent
                else:
                    out["gaps_s"].append(now - last)
                last = now
                out["token_ids"].extend(ids)
    except (aiohttp.ClientError, TimeoutError) as e:
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    out["total_s"] = time.perf_counter() - sent
    return out


async def run_load(url: str, bodies: list[dict], timeout_s: float = 3600.0) -> dict:
    """Every body streamed at once over one connection each; the streams' records in order."""
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        c0, t0 = cpu_s(), time.perf_counter()
        streams = await asyncio.gather(*(one_stream(session, url, b) for b in bodies))
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    return {"streams": streams, "wall_s": wall, "client_cpu_s": cpu}


def run_spec(path: str) -> int:
    """Run the load a SPEC file describes; its answer as JSON on stdout."""
    with open(path) as f:
        spec = json.load(f)
    try:
        import uvloop  # the server's loop too; a faster client disturbs the server less

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(run_load(spec["url"], spec["bodies"], spec.get("timeout_s", 3600.0)))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(run_spec(sys.argv[1]))
