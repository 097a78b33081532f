"""The seeds' deployment command, run as a user pastes it: 16 CPU ranks, a tiny W8A8
checkpoint with the DSpark drafter, and the page's verify curl at K=0 and K=7."""

from __future__ import annotations

import json

import pytest

from dspark_testing.server_process import ServerProcess
from tests.unit.config.seeds import DEPLOYMENT_PAGE, VERIFY_REQUEST, seeds_argv


@pytest.fixture(scope="module")
def w8a8_ckpt(tmp_path_factory) -> str:
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("seeds-e2e") / "dsv4-flash-w8a8"
    return make_checkpoint(str(out), size="tiny", w8a8=True, with_drafter=True, quiet=True)


def verify_answer(argv: list[str]) -> dict:
    """The page's two verify curls against a server started with argv: /health, then the
    completion, as sent."""
    server = ServerProcess(argv, timeout_s=600)
    try:
        status, health = server.get("/health")
        assert (status, json.loads(health)) == (200, {"status": "ok"}), health
        status, body = server.post("/v1/completions", VERIFY_REQUEST, timeout=600)
        assert status == 200, body
        return body
    finally:
        assert server.stop() == 0, server.log()[-3000:]


@pytest.mark.slow
def test_the_seeds_deployment_command_answers_the_verify_curl_alike_at_k0_and_k7(w8a8_ckpt):
    """The deployment page's command (with --backend cpu; ServerProcess picks the port) must
    start 16 ranks and answer the page's verify request with the same greedy text at K=0
    and K=7."""
    answers = []
    for k in (0, 7):
        argv = seeds_argv(DEPLOYMENT_PAGE, w8a8_ckpt, k)
        port = argv.index("--port")
        del argv[port : port + 2]
        answers.append(verify_answer([*argv, "--backend", "cpu"]))
    k0, k7 = ([(c["text"], c["finish_reason"]) for c in a["choices"]] for a in answers)
    assert k7 == k0 and k0[0][0]
    assert answers[0]["usage"] == answers[1]["usage"]
    assert answers[0]["model"] == "dsv4-flash-w8a8"
