"""The seeds' deployment command, verbatim but for the device: --backend sim on a Flash-shape
checkpoint without weights, 16 sim ranks at dp4/ep16/tp4 on this machine. The seeds' verify
curl must answer, with the same tokens at K=0 and K=7."""

from __future__ import annotations

import json

import pytest

from dspark_testing.server_process import ServerProcess, pools_full, wait_gone

NAME = "dsv4-flash-w8a8"
DEVICES = ",".join(str(i) for i in range(16))


def seeds_command(model: str, k: int) -> list[str]:
    """The seeds' command (reference: DSpark deployment page) less --platform a2a3 and
    --ring-heap (flags of the NPU runtime), plus the simulated device at 50x speed."""
    return [
        "--model", model,
        "--served-model-name", NAME,
        "--devices", DEVICES,
        "--dp", "4", "--ep", "16", "--tp", "4",
        "--block-size", "32", "--max-model-len", "1024", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "8192", "--long-prefill-token-threshold", "128",
        "--speculative-config", json.dumps({"method": "dspark", "num_speculative_tokens": k}),
        "--no-enable-prefix-caching",
        "--backend", "sim", "--device-profile", "npu-tile", "--sim-speed", "50",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def flash_ckpt(tmp_path_factory) -> str:
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("flash") / "flash"
    return make_checkpoint(str(out), size="flash", no_weights=True, with_drafter=True, quiet=True)


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
