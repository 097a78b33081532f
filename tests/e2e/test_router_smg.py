"""Two CPU replicas behind smg (the Shepherd Model Gateway): prefix affinity, load-aware
routing, drain and failover, with smg started here as a subprocess (router.py).

Each replica is a 1-rank server on the tiny checkpoint; which replica answered is read off
the response id (a per-process prefix, api/context.py). The figures each test measures
(affinity share, failed requests, the time smg takes to notice) are printed (pytest -s).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import time

import aiohttp
import pytest

from dspark_testing.prompts import token_prompt
from dspark_testing.server_process import ServerProcess, pools_full, wait_gone
from dspark_testing.stream_client import open_stream
from tests.e2e.router import SmgRouter, smg_binary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smg_binary() is None, reason="smg is not installed (pip install smg, or the `router` extra)"),
]

PREFIX_TOKENS = 640
WORDS = "page ring rank step draft token cache mesh queue prefix verify lease split merge route".split()


def id_prefix(response_id: str) -> str:
    return response_id.split("-", 1)[1][:12]


class Replicas:
    """Two 1-rank servers, and which of them answered a response (by its id)."""

    def __init__(self, ckpt: str, *args: str):
        self.servers = [ServerProcess(["--model", ckpt, *args], wait=False) for _ in range(2)]
        for s in self.servers:
            s.wait_ready()
        self.model = self.servers[0].complete("hi", 1)["model"]
        self.index = {id_prefix(s.complete("hi", 1)["id"]): i for i, s in enumerate(self.servers)}

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def served_by(self, response_id: str) -> int:
        return self.index[id_prefix(response_id)]

    def stop(self) -> None:
        for s in self.servers:
            s.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def replicas(tiny_ckpt):
    pair = Replicas(tiny_ckpt, "--max-num-seqs", "1")  # one request at a time: a busy replica queues
    yield pair
    pair.stop()


async def post(http: aiohttp.ClientSession, url: str, body: dict, timeout_s: float = 120) -> tuple[int, dict]:
    async with http.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        return r.status, await r.json(content_type=None)


def long_text(server: ServerProcess, seed: int, min_tokens: int) -> str:
    """Words drawn by seed until the text is at least min_tokens tokens long."""
    rng = random.Random(seed)
    text = ""
    while True:
        text += " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(64)) + " "
        status, out = server.post("/tokenize", {"prompt": text, "add_special_tokens": False})
        assert status == 200, out
        if out["count"] >= min_tokens:
            return text


def open_collector(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[asyncio.Task, asyncio.Event]:
    """A stream opened and read to its end in a task; the event is set once its first chunk
    is in (a server answers a stream's head with its first token, so opening waits too)."""
    first = asyncio.Event()

    async def collect() -> list:
        stream = await open_stream(http, url, body)
        events = []
        async for event in stream.events():
            events.append(event)
            first.set()
        return events

    return asyncio.create_task(collect()), first


async def wait_until(predicate, timeout_s: float) -> float:
    """Seconds until predicate() (run in a thread) is true; fails after timeout_s."""
    t0 = time.monotonic()
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() - t0 < timeout_s, "condition not reached"
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


async def test_smg_identifies_each_replica_and_reads_its_load_without_a_404(replicas):
    """smg must file each replica as a vLLM-like HTTP worker with the served model, its
    context length and path, must hold a load report per replica (KV capacity included),
    and its log must show no 404 from any poll and no unidentified backend."""
    router = await asyncio.to_thread(SmgRouter, replicas.urls, "cache_aware")
    try:

        def reported() -> bool:
            return all((w.get("engine_load") or {}).get("loads") for w in router.workers().values())

        await wait_until(reported, 30)
        workers = router.workers()
        for url, server in zip(replicas.urls, replicas.servers):
            w = workers[url]
            assert (w["runtime_type"], w["model_id"], w["connection_mode"]) == ("vllm", replicas.model, "http"), w
            card = json.loads(server.get("/v1/models")[1])["data"][0]
            assert w["labels"]["max_model_len"] == str(card["max_model_len"]), w["labels"]
            assert w["labels"]["model_path"] == card["root"], w["labels"]
            assert w["engine_load"]["loads"][0]["max_total_num_tokens"] > 0, w["engine_load"]
        log = router.log()
        assert not re.search(r"returned 404|status 404|status_code=404|Could not identify backend", log), log[-3000:]
    finally:
        router.stop()


async def test_requests_sharing_a_long_prefix_land_on_one_replica_and_different_prefixes_spread(replicas, http):
    """Behind smg's cache_aware policy, six requests sharing a 640-token prefix must all be
    served by one replica, each after the first reusing the prefix from its cache (the
    replica's prefix-cache hit counter grows by exactly the cached tokens the responses
    report, the other's not at all); eight requests with different prefixes must reach
    both replicas."""
    router = await asyncio.to_thread(
        SmgRouter, replicas.urls, "cache_aware", "--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0"
    )
    try:
        shared = await asyncio.to_thread(long_text, replicas.servers[0], 1, PREFIX_TOKENS)
        hits_before = [s.metrics_json()["prefix_cache_hits_total"] for s in replicas.servers]
        served, cached = [], []
        for i in range(6):
            body = {"model": replicas.model, "prompt": shared + f"question {i}?", "max_tokens": 4}
            status, out = await post(http, router.url, body)
            assert status == 200, out
            served.append(replicas.served_by(out["id"]))
            cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
        hits = [s.metrics_json()["prefix_cache_hits_total"] - h for s, h in zip(replicas.servers, hits_before)]
        home = served[0]
        share = served.count(home) / len(served)
        print(f"\naffinity: shared-prefix requests on one replica {share:.0%}; cached tokens {cached}; hits {hits}")
        assert share == 1.0, served
        assert all(c >= PREFIX_TOKENS - 128 for c in cached[1:]), cached
        assert hits[home] == sum(cached) and hits[1 - home] == 0, (hits, cached)

        spread = []
        for i in range(8):
            text = await asyncio.to_thread(long_text, replicas.servers[0], 100 + i, 300)
            status, out = await post(http, router.url, {"model": replicas.model, "prompt": text, "max_tokens": 4})
            assert status == 200, out
            spread.append(replicas.served_by(out["id"]))
        print(f"different prefixes per replica: {[spread.count(0), spread.count(1)]}")
        assert set(spread) == {0, 1}, spread
    finally:
        router.stop()


@pytest.mark.parametrize("policy", ["power_of_two", "least_load"])
async def test_with_one_replica_busy_load_aware_policies_send_new_requests_to_the_idle_one(replicas, http, policy):
    """While replica 0 has a queue (five long requests sent to it directly, one running at
    a time, so only its load report tells smg), six short requests through smg with
    power_of_two or least_load, one per load poll, must all be served by replica 1."""
    router = await asyncio.to_thread(SmgRouter, replicas.urls, policy)
    busy, idle = replicas.servers
    tasks = []
    try:
        for seed in range(5):
            body = {"prompt": token_prompt(600, seed=seed), "max_tokens": 400, "ignore_eos": True}
            tasks.append(open_collector(http, busy.url, body)[0])

        def smg_sees_a_queue() -> bool:
            load = router.workers().get(busy.url, {}).get("engine_load") or {}
            return sum(p["num_waiting_reqs"] for p in load.get("loads", [])) >= 3

        await wait_until(smg_sees_a_queue, 30)
        served = []
        for i in range(6):
            status, out = await post(
                http, router.url, {"model": replicas.model, "prompt": f"short {i}", "max_tokens": 2}
            )
            assert status == 200, out
            served.append(replicas.served_by(out["id"]))
            # NOTE: a sleep on purpose: > --load-monitor-interval, each request meets a fresh
            # report (smg's /workers shows no poll count or time to wait for)
            await asyncio.sleep(1.5)
        print(
            f"\n{policy}: short requests per replica while replica 0 has a queue: {[served.count(0), served.count(1)]}"
        )
        assert served == [1] * 6, served
        assert busy.engine_stats()["partitions"][0]["num_waiting"] > 0  # replica 0 still had a queue
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        router.stop()
    assert pools_full(busy.wait_idle(30)) and pools_full(idle.wait_idle(30))


async def test_sigterm_on_a_replica_finishes_its_streams_while_smg_sends_new_requests_to_the_other(tiny_ckpt, http):
    """SIGTERM on a replica holding streams (smg round_robin, so new requests are offered
    to it too): every stream on either replica must end with all its tokens and [DONE] and
    no error, every new request sent during the drain must succeed on the other replica
    (the draining one refuses those offered to it with 503, smg retries them, and its health
    check then drops the replica), and the drained replica must exit 0."""
    pair = await asyncio.to_thread(Replicas, tiny_ckpt, "--shutdown-timeout", "120")
    router = None
    try:
        router = await asyncio.to_thread(SmgRouter, pair.urls, "round_robin")
        streams = []
        for seed in range(4):
            body = {
                "model": pair.model,
                "prompt": f"stream {seed}: " + " ".join(WORDS[seed:]),  # smg takes text prompts only
                "max_tokens": 300,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
            task, first = open_collector(http, router.url, body)
            await asyncio.wait_for(first.wait(), 60)
            streams.append(task)
        victim_index = 0
        victim, survivor = pair.servers[victim_index], pair.servers[1 - victim_index]
        victim.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        noticed = asyncio.create_task(wait_until(lambda: not router.healthy(victim.url), 60))
        results = []
        for i in range(12):
            status, out = await post(http, router.url, {"model": pair.model, "prompt": f"new {i}", "max_tokens": 2})
            results.append(
                (round(time.monotonic() - t0, 2), status, pair.served_by(out["id"]) if status == 200 else out)
            )
            await asyncio.sleep(0.25)  # NOTE: on purpose: new requests spread over the victim's drain
        notice_s = await noticed
        failed = [r for r in results if r[1] != 200]
        refused = await asyncio.to_thread(router.metric, "smg_router_upstream_responses_total", status_code="503")
        retried = await asyncio.to_thread(router.metric, "smg_worker_retries_total")
        print(f"\ndrain: the draining replica refused {refused:g} offered requests, smg retried {retried:g}")
        print(f"\ndrain: smg marked the draining replica unhealthy after {notice_s:.1f} s; new requests {results}")
        events = await asyncio.wait_for(asyncio.gather(*streams), 180)
        for ev in events:
            assert ev[-1] == "[DONE]" and not [e for e in ev if isinstance(e, dict) and "error" in e], ev[-3:]
            usage = [e["usage"] for e in ev if isinstance(e, dict) and e.get("usage")]
            assert usage and usage[-1]["completion_tokens"] == 300, ev[-3:]
        served = {pair.served_by(next(e for e in ev if isinstance(e, dict))["id"]) for ev in events}
        print(
            f"drain: {len(events)} streams on replicas {sorted(served)} all complete; failed new requests {len(failed)}"
        )
        assert served == {0, 1}  # the drained replica really had streams to finish
        assert failed == [] and {r[2] for r in results} == {1 - victim_index}, results
        assert refused >= 1 and retried >= refused  # requests did meet the draining replica first
        assert await asyncio.to_thread(victim.proc.wait, 120) == 0, victim.log()[-3000:]
        assert pools_full(survivor.wait_idle(30))
    finally:
        if router is not None:
            router.stop()
        pair.stop()


async def test_after_sigkill_on_a_replica_smg_fails_no_request_and_nothing_hangs(tiny_ckpt, http):
    """SIGKILL on a replica (smg round_robin): requests sent one after another from then on
    must all succeed on the other replica within their timeout, both before smg's health
    check notices the dead one (smg retries the refused connection) and after it."""
    pair = await asyncio.to_thread(Replicas, tiny_ckpt)
    router = None
    victim, survivor = pair.servers
    ranks = victim.rank_pids()
    try:
        router = await asyncio.to_thread(SmgRouter, pair.urls, "round_robin")
        victim.proc.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        noticed_at, results = None, []
        while noticed_at is None or len([r for r in results if r[0] > noticed_at]) < 10:
            assert time.monotonic() - t0 < 90, f"smg did not notice the dead replica: {results}"
            sent = time.monotonic()
            try:
                status, out = await post(http, router.url, {"model": pair.model, "prompt": "q", "max_tokens": 2}, 60)
                where = pair.served_by(out["id"]) if status == 200 else out
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                status, where = "failed", repr(e)
            results.append((sent - t0, status, where, time.monotonic() - sent))
            if noticed_at is None and not await asyncio.to_thread(router.healthy, victim.url):
                noticed_at = time.monotonic() - t0
            await asyncio.sleep(0.1)
        retried = await asyncio.to_thread(router.metric, "smg_worker_retries_total")
        before = [r for r in results if r[0] <= noticed_at]
        after = [r for r in results if r[0] > noticed_at]
        print(
            f"\nfailover: smg noticed the killed replica after {noticed_at:.1f} s; requests before "
            f"{len(before)} (failed {len([r for r in before if r[1] != 200])}), after {len(after)} "
            f"(failed {len([r for r in after if r[1] != 200])}); smg retried {retried:g}; "
            f"slowest answer {max(r[3] for r in results):.2f} s"
        )
        assert [r for r in results if r[1] != 200] == [], results
        assert {r[2] for r in after} == {1}, after
    finally:
        if router is not None:
            router.stop()
        pair.stop()
        for pid in await asyncio.to_thread(wait_gone, ranks, 10):  # ranks left by the SIGKILL
            os.kill(pid, signal.SIGKILL)
