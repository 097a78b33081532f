"""API keys: which routes need one, the 401 body and challenge, constant-time checks, and
that no key ever reaches a log or a config's repr."""

from __future__ import annotations

import hmac
import logging

import pytest

from dspark_loop.api import auth
from dspark_loop.config.cli import parse_args
from tests.unit.api.harness import MODEL, serving

KEYS = ("sk-first-0123456789", "sk-second-abcdefghij")
BODY = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "headers,presented",
    [
        ({}, False),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, True),
        ({"Authorization": "Bearer"}, True),
        (bearer("sk-wrong"), True),
        (bearer(KEYS[0] + "x"), True),
        (bearer(KEYS[0][:-1]), True),
    ],
    ids=["missing", "basic-scheme", "empty-bearer", "wrong", "longer", "prefix"],
)
async def test_a_missing_or_wrong_key_gets_openais_401_and_a_bearer_challenge(headers, presented):
    """Every model route must answer 401 with type invalid_request_error, code
    invalid_api_key and a WWW-Authenticate Bearer challenge (error="invalid_token" when a
    credential was sent), without running the engine."""
    async with serving(api_keys=KEYS) as client:
        for method, path, body in [
            ("POST", "/v1/completions", BODY),
            ("POST", "/v1/chat/completions", {"messages": []}),
            ("GET", "/v1/models", None),
            ("POST", "/tokenize", {"prompt": "hi"}),
            ("POST", "/detokenize", {"tokens": [1]}),
        ]:
            r = await client.request(method, path, json=body, headers=headers)
            assert r.status == 401, path
            err = (await r.json())["error"]
            assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "invalid_api_key", None)
            challenge = r.headers["WWW-Authenticate"]
            assert challenge.startswith("Bearer ")
            assert ('error="invalid_token"' in challenge) == presented
        assert client.engine.requests == []


async def test_every_configured_key_is_accepted_and_the_scheme_is_case_insensitive():
    """Each of several keys must pass, with `Bearer` or `bearer` and stray spaces."""
    async with serving(api_keys=KEYS) as client:
        for header in [f"Bearer {KEYS[0]}", f"bearer {KEYS[1]}", f"  Bearer   {KEYS[1]} "]:
            r = await client.post("/v1/completions", json=BODY, headers={"Authorization": header})
            assert r.status == 200, header
        assert len(client.engine.requests) == 3


async def test_health_metrics_and_openapi_stay_open_with_keys():
    """/health and /openapi.json must answer without a key (probes, scrapers, tooling)."""
    async with serving(api_keys=KEYS) as client:
        assert (await client.get("/health")).status == 200
        r = await client.get("/openapi.json")
        assert r.status == 200 and (await r.json())["openapi"].startswith("3.1")


async def test_without_keys_no_route_asks_for_one():
    """A server started without keys must serve every route as before."""
    async with serving() as client:
        assert (await client.post("/v1/completions", json=BODY)).status == 200
        assert (await client.get("/v1/models")).status == 200


async def test_the_check_compares_digests_against_every_key_in_constant_time(monkeypatch):
    """The key must be checked with hmac.compare_digest against every configured key, even
    when the first one matches (no early exit), on fixed-length digests."""
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    check = auth.KeyCheck(KEYS)
    assert check.matches(KEYS[0]) and check.matches(KEYS[1])
    assert not check.matches("short") and not check.matches(KEYS[0] * 10)
    assert calls == [(32, 32)] * (4 * len(KEYS))


async def test_keys_never_reach_the_logs_or_the_config_repr(caplog, monkeypatch):
    """No log record of a served request (accepted or refused), and no repr of the parsed
    config, may contain a key, whether it came from --api-key or DSPARK_API_KEY."""
    monkeypatch.setenv("DSPARK_API_KEY", f"{KEYS[1]}, sk-env-only-777")
    cfg = parse_args(["--api-key", KEYS[0], "--log-level", "debug"])
    assert cfg.api_keys == (KEYS[0], KEYS[1], "sk-env-only-777")
    assert not any(k in repr(cfg) for k in cfg.api_keys)
    caplog.set_level(logging.DEBUG)
    async with serving(api_keys=cfg.api_keys) as client:
        for key in (*cfg.api_keys, "sk-wrong-key-xyz"):
            await client.post("/v1/completions", json=BODY, headers=bearer(key))
        await client.post("/v1/completions", json=BODY, headers={"Authorization": f"Basic {KEYS[0]}"})
    text = caplog.text + " ".join(str(r.args) for r in caplog.records)
    assert "request" in text  # the requests were logged ...
    for key in (*cfg.api_keys, "sk-wrong-key-xyz"):
        assert key not in text  # ... and no key was


@pytest.mark.parametrize(
    "argv,env",
    [(["--api-key", ""], None), (["--api-key", "has space"], None), ([], " , "), ([], "bad\tkey")],
    ids=["empty-flag", "space-flag", "empty-env", "tab-env"],
)
def test_a_bad_key_exits_2_naming_the_flag_without_echoing_it(argv, env, monkeypatch, capsys):
    """An unusable key must exit 2 with an error naming --api-key or DSPARK_API_KEY and
    must not print the value."""
    if env is None:
        monkeypatch.delenv("DSPARK_API_KEY", raising=False)
    else:
        monkeypatch.setenv("DSPARK_API_KEY", env)
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--api-key" in err or "DSPARK_API_KEY" in err
    assert "has space" not in err and "bad\tkey" not in err
