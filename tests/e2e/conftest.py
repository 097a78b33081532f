"""Fixtures: the tiny checkpoint (its drafter twin, and a Flash-shape one for the sim), a
4-rank server (dp2/tp2/ep4) and a 1-rank server for the session, the transformers
reference, and the rule every served test ends with: the pools are full."""

from __future__ import annotations

import os

import aiohttp
import pytest

from dspark_testing.server_process import ServerProcess, pools_full

E2E_SEED = 7
# DSPARK_E2E_TOPOLOGY="--dp 1 --tp 4 --ep 4" runs the suite on another 4-rank shape.
TOPOLOGY_4 = os.environ.get("DSPARK_E2E_TOPOLOGY", "--dp 2 --tp 2 --ep 4").split()


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> str:
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(str(tmp_path_factory.mktemp("e2e") / "tiny"), size="tiny", seed=E2E_SEED, quiet=True)


@pytest.fixture(scope="session")
def drafter_ckpt(tmp_path_factory) -> str:
    """tiny_ckpt with the DSpark drafter (every tensor has its own random stream, so the
    trunk equals tiny_ckpt's); read only, as every checkpoint here."""
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("drafter") / "tiny"
    return make_checkpoint(str(out), size="tiny", seed=E2E_SEED, with_drafter=True, quiet=True)


@pytest.fixture(scope="session")
def flash_ckpt(tmp_path_factory) -> str:
    """A Flash-shape checkpoint without weights, with the drafter: what the sim ranks read."""
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("flash") / "flash"
    return make_checkpoint(str(out), size="flash", no_weights=True, with_drafter=True, quiet=True)


@pytest.fixture(scope="session")
def server4(tiny_ckpt):
    server = ServerProcess(["--model", tiny_ckpt, *TOPOLOGY_4])
    yield server
    code = server.stop()
    assert code == 0, server.log()[-4000:]


@pytest.fixture(scope="session")
def server1(tiny_ckpt):
    """One rank: the reference topology, and the cheap place for long requests. NOTE: in
    lockstep (--no-async-scheduling): the served suites compare the other servers, which
    plan one step ahead (the default), with it."""
    server = ServerProcess(["--model", tiny_ckpt, "--no-async-scheduling"])
    yield server
    code = server.stop()
    assert code == 0, server.log()[-4000:]


class SoloResults:
    """Each prompt served alone (non-stream), memoised: what concurrency must not change."""

    def __init__(self, server: ServerProcess):
        self.server = server
        self._memo: dict = {}

    def __call__(self, prompt, max_tokens: int) -> list[int]:
        key = (prompt if isinstance(prompt, str) else tuple(prompt), max_tokens)
        if key not in self._memo:
            self._memo[key] = self.server.complete(prompt, max_tokens)["choices"][0]["token_ids"]
        return self._memo[key]


@pytest.fixture(scope="session")
def solo4(server4) -> SoloResults:
    return SoloResults(server4)


@pytest.fixture(scope="session")
def solo1(server1) -> SoloResults:
    return SoloResults(server1)


@pytest.fixture(scope="session")
def reference(tiny_ckpt):
    from dspark_testing.greedy_reference import GreedyReference

    return GreedyReference(tiny_ckpt)


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        yield session


@pytest.fixture(autouse=True)
def pools_return_to_full(request):
    """After every test, a live server it used must hold no pages and no requests."""
    yield
    for value in list(request.node.funcargs.values()):
        value = getattr(value, "server", value)  # SoloResults wraps its server
        if not isinstance(value, ServerProcess) or value.proc.poll() is not None:
            continue
        status, _ = value.get("/health")
        if status != 200:
            continue  # a test that killed the engine on purpose
        stats = value.wait_idle()
        assert pools_full(stats), f"pages or requests still held after the test: {stats}"
