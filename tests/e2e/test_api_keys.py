"""API keys on a real server: keys from the flag and the environment, 401s, open probes,
and a log that never shows a key."""

from __future__ import annotations

import pytest

from dspark_testing.server_process import ServerProcess

FLAG_KEY = "sk-flag-5a1c2f9e"
ENV_KEYS = ("sk-env-one-77d3", "sk-env-two-e81b")


@pytest.fixture(scope="module")
def keyed_server(tiny_ckpt):
    server = ServerProcess(
        ["--model", tiny_ckpt, "--api-key", FLAG_KEY, "--log-level", "debug"],
        env={"DSPARK_API_KEY": ",".join(ENV_KEYS)},
    )
    yield server
    assert server.stop() == 0


def test_every_key_works_and_anything_else_is_a_401(keyed_server):
    """Each key, from --api-key or DSPARK_API_KEY, must serve a completion; no key or a
    wrong one must get 401 invalid_api_key with a Bearer challenge."""
    body = {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True}
    for key in (FLAG_KEY, *ENV_KEYS):
        status, out = keyed_server.post("/v1/completions", body, headers={"Authorization": f"Bearer {key}"})
        assert status == 200 and out["usage"]["completion_tokens"] == 3, out
    for headers in ({}, {"Authorization": "Bearer sk-not-a-key"}, {"Authorization": FLAG_KEY}):
        status, out = keyed_server.post("/v1/completions", body, headers=headers)
        assert status == 401 and out["error"]["code"] == "invalid_api_key", (headers, out)
    status, _ = keyed_server.get("/v1/models")
    assert status == 401


def test_probes_stay_open_and_the_log_never_shows_a_key(keyed_server):
    """/health, /metrics and /openapi.json must answer without a key, and the server's
    whole log (debug level, after accepted and refused requests) must hold no key."""
    for path in ("/health", "/metrics", "/metrics/json", "/openapi.json"):
        status, _ = keyed_server.get(path)
        assert status == 200, path
    keyed_server.post(
        "/v1/completions", {"prompt": "hi", "max_tokens": 1}, headers={"Authorization": "Bearer sk-wrong-guess"}
    )
    log = keyed_server.log()
    assert "request" in log
    for key in (FLAG_KEY, *ENV_KEYS, "sk-wrong-guess"):
        assert key not in log


def test_the_ranks_do_not_inherit_the_key_variable(keyed_server):
    """DSPARK_API_KEY is read once by the server; its rank processes' environment must
    not hold it."""
    for pid in keyed_server.rank_pids():
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
        assert b"DSPARK_API_KEY" not in env and all(k.encode() not in env for k in ENV_KEYS)
