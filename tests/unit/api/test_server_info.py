"""The routes a router polls (api/server_info.py): what /version, /server_info, /model_info
and /loads say, read from the config and the engine's cache_stats(), and who may ask."""

from __future__ import annotations

import pytest

from dspark_loop.api.app import GATE_KEY
from dspark_loop.api.server_info import ROUTER_INFO_PATHS
from dspark_loop.contract.cache_layout import CacheLayout
from tests.unit.api.fake_engine import FakeEngine, tiny_model_config
from tests.unit.api.harness import MODEL, serving

KEY = "sk-router-0123456789"
TOPOLOGY = dict(dp=2, tp=2, ep=4, max_num_seqs=8)


def two_partitions() -> dict:
    """cache_stats() of a 2-partition engine: families swa (ring), c4, c16."""
    return {
        "families": ["swa", "c4", "c16"],
        "partitions": [
            {
                "free": [10, 6, 7],
                "total": [16, 8, 8],
                "num_running": 2,
                "num_waiting": 1,
                "num_tokens": 300,
                "num_waiting_tokens": 40,
            },
            {
                "free": [16, 8, 8],
                "total": [16, 8, 8],
                "num_running": 0,
                "num_waiting": 0,
                "num_tokens": 0,
                "num_waiting_tokens": 0,
            },
        ],
        "num_requests": 3,
        "num_open_streams": 3,
        "num_steps": 40,
        "dspark": {},
    }


def running_engine() -> FakeEngine:
    engine = FakeEngine(max_model_len=64)
    engine.cache_stats = two_partitions
    engine.num_running, engine.num_waiting = 2, 1
    return engine


async def get_json(client, path: str, headers: dict | None = None) -> dict:
    r = await client.get(path, headers=headers or {})
    assert r.status == 200, (path, r.status, await r.text())
    return await r.json()


async def test_loads_report_each_partition_in_sglangs_shape_from_the_engines_own_counts():
    """/loads, /v1/loads and /get_load must answer the same SGLang load report: one entry
    per DP partition with its running/waiting requests, the tokens its requests hold and
    those its waiting ones have still to compute, its token capacity (the scarcest
    full-history family: pages x tokens per page), its page usage per family, and the
    server-wide sums."""
    tokens_per_page = [f.tokens_per_page for f in CacheLayout.for_model(tiny_model_config(), 32).families]
    async with serving(running_engine(), **TOPOLOGY) as client:
        bodies = [await get_json(client, p) for p in ("/loads?model=" + MODEL, "/v1/loads", "/get_load")]
    assert all(
        {k: v for k, v in b.items() if k != "timestamp"} == {k: v for k, v in bodies[0].items() if k != "timestamp"}
        for b in bodies
    )
    body = bodies[0]
    assert body["dp_rank_count"] == 2 and [p["dp_rank"] for p in body["loads"]] == [0, 1]
    busy, idle = body["loads"]
    assert (busy["num_running_reqs"], busy["num_waiting_reqs"], busy["num_total_reqs"]) == (2, 1, 3)
    assert busy["num_used_tokens"] == 300 and idle["num_used_tokens"] == 0
    assert busy["num_waiting_uncached_tokens"] == 40 and idle["num_waiting_uncached_tokens"] == 0
    assert busy["max_total_num_tokens"] == min(8 * tokens_per_page[1], 8 * tokens_per_page[2])
    assert busy["pages_used"] == [6, 2, 1] and busy["pages_free"] == [10, 6, 7]
    assert busy["token_usage"] == pytest.approx(9 / 32) and idle["token_usage"] == 0.0
    assert busy["max_running_requests"] == 4  # --max-num-seqs 8 over 2 partitions
    assert (body["num_running_reqs"], body["num_waiting_reqs"], body["load"]) == (2, 1, 3)
    assert body["num_tokens_in_flight"] == 300 and body["families"] == ["swa", "c4", "c16"]
    assert body["status"] == "ok"


async def test_server_info_names_the_model_topology_k_and_capacity_in_sglangs_fields():
    """/server_info (and /get_server_info) must carry the served name, the checkpoint path,
    the context length the engine enforces, dp/tp/ep, K and the KV capacity summed over
    partitions; /model_info (and /get_model_info) the checkpoint's architecture; /version
    a version string."""
    async with serving(running_engine(), **TOPOLOGY) as client:
        info = await get_json(client, "/server_info")
        assert await get_json(client, "/get_server_info") == info
        model = await get_json(client, "/model_info")
        assert await get_json(client, "/get_model_info") == model
        version = await get_json(client, "/version")
    assert (info["served_model_name"], info["model_path"]) == (MODEL, "/models/tiny-test")
    assert info["context_length"] == info["max_model_len"] == 64
    assert (info["dp_size"], info["tp_size"], info["ep_size"], info["pp_size"]) == (2, 2, 4, 1)
    assert info["max_running_requests"] == 8
    assert info["num_speculative_tokens"] in (0, 7)
    assert (info["speculative_algorithm"] is None) == (info["num_speculative_tokens"] == 0)
    assert info["max_total_tokens"] == 2 * 8 * 128
    assert info["status"] == "ok" and info["version"] == version["version"] and version["version"]
    assert model["architectures"] == ["DeepseekV4ForCausalLM"] and model["is_generation"] is True
    assert model["served_model_name"] == MODEL and model["max_model_len"] == 64


async def test_before_the_ranks_are_up_the_load_report_is_empty_and_says_not_ready():
    """With no engine stats yet, /loads must answer 200 with no partition and status
    not_ready, and /server_info a null capacity: a router polling early must not see a 5xx."""
    async with serving(FakeEngine(ready=False)) as client:
        loads = await get_json(client, "/loads")
        info = await get_json(client, "/server_info")
    assert loads["loads"] == [] and loads["load"] == 0 and loads["status"] == "not_ready"
    assert info["max_total_tokens"] is None and info["status"] == "not_ready"


async def test_a_draining_server_says_so_in_its_load_report():
    """After SIGTERM (the gate draining) /loads and /server_info must say status draining,
    the word /health answers with its 503."""
    async with serving(running_engine()) as client:
        client.server.app[GATE_KEY].draining = True
        loads = await get_json(client, "/loads")
        info = await get_json(client, "/server_info")
        health = await client.get("/health")
        assert health.status == 503
    assert loads["status"] == info["status"] == "draining"


async def test_router_routes_are_open_with_api_keys_unless_the_operator_protects_them():
    """With API keys, every router route must answer without a key (like /health and
    /metrics); with protect_router_info each must answer 401 without the key and 200 with it."""
    async with serving(running_engine(), api_keys=(KEY,)) as client:
        for path in ROUTER_INFO_PATHS:
            assert (await client.get(path)).status == 200, path
    async with serving(running_engine(), api_keys=(KEY,), protect_router_info=True) as client:
        for path in ROUTER_INFO_PATHS:
            assert (await client.get(path)).status == 401, path
            assert (await client.get(path, headers={"Authorization": f"Bearer {KEY}"})).status == 200, path
