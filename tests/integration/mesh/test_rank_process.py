"""One rank process driven by hand through its own entry point (no Mesh)."""

import os
import subprocess
import sys

import pytest

from dspark_loop.contract.mesh_auth import SECRET_ENV
from dspark_loop.contract.protocol import ENCODER, Hello, RankConfig, Shutdown, StepResult, identity
from dspark_loop.mesh.nodes import free_port
from dspark_loop.mesh.router_socket import MeshSocket
from tests.integration.mesh.conftest import FAKE_RUNNER, REPO, alive, fake_env, wait_until
from tests.integration.mesh.plans import prefill_plan


def rank_argv(address: str, model_dir: str, parent_pid: int = 0) -> list[str]:
    cfg = RankConfig(
        model=model_dir,
        runner=FAKE_RUNNER,
        log_level="warning",
        connect=address,
        dist_init=f"tcp://127.0.0.1:{free_port('127.0.0.1')}",
        parent_pid=parent_pid,
    )
    return [sys.executable, "-m", "workers", "--rank", "0", "--config", cfg.encode()]


SECRET = "rank-process-test-secret"


@pytest.fixture
async def router():
    """The server's socket (it answers the rank's Knock); the rank gets SECRET."""
    sock = MeshSocket(SECRET, {identity(0)})
    yield sock, sock.bind("127.0.0.1")
    sock.close()


def rank_env() -> dict[str, str]:
    return {**os.environ, **fake_env(), SECRET_ENV: SECRET}


async def recv(sock: MeshSocket, timeout_s: float = 30.0):
    got = await sock.recv(timeout_s)
    assert got is not None, f"nothing from the rank within {timeout_s} s"
    return got


async def test_malformed_frames_are_dropped_and_the_rank_keeps_serving(router, fake_model_dir):
    """Frames that do not decode as a plan (garbage, a wrong message type) must be dropped
    unexecuted; the next good plan must still be answered, and Shutdown must end the rank
    with exit code 0."""
    sock, address = router
    env = rank_env()
    proc = subprocess.Popen(rank_argv(address, fake_model_dir), env=env, cwd=REPO)
    try:
        sender, hello = await recv(sock)
        assert isinstance(hello, Hello) and not hello.error and hello.pid == proc.pid
        for junk in [b"\xc1not msgpack", b"", ENCODER.encode(Hello(1, 0, 1, 0))]:
            await sock.send_frame(sender, junk)
        await sock.send(sender, prefill_plan(7, 1))
        _, result = await recv(sock)
        assert isinstance(result, StepResult) and result.step_id == 7 and not result.error
        assert len(result.token_ids) == 2 * 4  # two sampled prefills, int32 each
        await sock.send(sender, Shutdown("test done"))
        assert await wait_until(lambda: proc.poll() is not None, 10.0)
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()


async def test_rank_exits_by_itself_when_its_server_dies(router, fake_model_dir):
    """A rank whose parent (the server) is killed must exit on its own within seconds."""
    sock, address = router
    env = rank_env()
    # NOTE: a small Python parent starts the rank with its own pid as parent_pid.
    script = (
        "import os, subprocess, sys\n"
        "from tests.integration.mesh.test_rank_process import rank_argv\n"
        "p = subprocess.Popen(rank_argv(sys.argv[1], sys.argv[2], os.getpid()))\n"
        "print(p.pid, flush=True)\n"
        "p.wait()\n"
    )
    shell = subprocess.Popen(
        [sys.executable, "-c", script, address, fake_model_dir], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    rank_pid = int(shell.stdout.readline())
    try:
        _, hello = await recv(sock, 120.0)  # the rank is up: it said Hello to its server
        assert isinstance(hello, Hello) and hello.pid == rank_pid and alive(rank_pid)
        shell.kill()
        shell.wait()
        assert await wait_until(lambda: not alive(rank_pid), 5.0)
    finally:
        if alive(rank_pid):
            os.kill(rank_pid, 9)


def test_rank_without_the_mesh_secret_exits_2_naming_the_variable(fake_model_dir):
    """A rank started without DSPARK_MESH_SECRET cannot prove itself: it must exit 2 at once
    with a message naming the variable (before loading anything)."""
    env = {k: v for k, v in rank_env().items() if k != SECRET_ENV}
    proc = subprocess.run(
        rank_argv("tcp://127.0.0.1:9", fake_model_dir), env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "DSPARK_MESH_SECRET is not set" in proc.stderr
