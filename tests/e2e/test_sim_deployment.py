"""The seeds' deployment command, verbatim (--platform and --ring-heap included) but for the
device: --backend sim on a Flash-shape checkpoint without weights, 16 sim ranks at
dp4/ep16/tp4 on this machine. The seeds' verify
curl must answer, with the same tokens at K=0 and K=7."""

from __future__ import annotations

from dspark_testing.server_process import ServerProcess, pools_full, wait_gone
from tests.unit.config.seeds import DEPLOYMENT_PAGE, seeds_argv

NAME = "dsv4-flash-w8a8"


def seeds_command(model: str, k: int) -> list[str]:
    """The deployment page's command verbatim (tests/unit/config/seeds.py), --model and K
    filled in, plus the simulated device at 50x speed. NOTE: its `--port 8000` is dropped:
    the test server listens on a free port (ServerProcess passes it)."""
    argv = seeds_argv(DEPLOYMENT_PAGE, model, k)
    at = argv.index("--port")
    del argv[at : at + 2]
    return [*argv, "--backend", "sim", "--device-profile", "npu-tile", "--sim-speed", "50"]


def verify_curl(server: ServerProcess) -> list[int]:
    """The seeds' verify step: /health, then a 32-token greedy completion of "Huawei is"."""
    assert server.get("/health")[0] == 200
    status, body = server.post(
        "/v1/completions",
        {"model": NAME, "prompt": "Huawei is", "max_tokens": 32, "temperature": 0, "return_token_ids": True},
    )
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("length", "stop") and choice["text"]
    return choice["token_ids"]


def test_the_seeds_command_serves_on_16_sim_ranks_with_equal_tokens_at_k0_and_k7(flash_ckpt):
    """16 sim ranks must start, answer the seeds' verify curl, give K=7 exactly K=0's
    tokens, leave the pools full and exit with the server."""
    tokens = {}
    for k in (0, 7):
        server = ServerProcess(seeds_command(flash_ckpt, k), timeout_s=300)
        try:
            assert len(server.ranks) == 16
            tokens[k] = verify_curl(server)
            assert pools_full(server.wait_idle())
        finally:
            assert server.stop() == 0, server.log()[-3000:]
        assert wait_gone(server.ranks, 10) == []
    assert tokens[0] == tokens[7] and len(tokens[0]) == 32
