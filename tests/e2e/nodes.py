"""Two "hosts" on one machine: node 0 is a ServerProcess, node 1 a NodeProcess (its agent).

port = free_port_pair()                 # --dist-init-addr 127.0.0.1:port (+1 for the mesh)
node1 = NodeProcess(node_args(ckpt, port, 1), env=SECRET_ENV_VARS)
node0 = ServerProcess(node_args(ckpt, port, 0), env=SECRET_ENV_VARS)
node1.kill()                            # the host is gone: agent and ranks, SIGKILL
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from dspark_loop.contract.mesh_auth import SECRET_ENV
from dspark_testing.server_process import REPO, children_of

SECRET = "two-node-test-secret-0123456789"
SECRET_ENV_VARS = {SECRET_ENV: SECRET}
TOPOLOGY = ["--dp", "2", "--tp", "2", "--ep", "4"]


def free_port_pair() -> int:
    """A port p with p and p + 1 free on loopback (the rendezvous and the mesh)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no two consecutive free ports")


def node_args(ckpt: str, port: int, node: int, *extra: str) -> list[str]:
    return [
        "--model",
        ckpt,
        *TOPOLOGY,
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--dist-init-addr",
        f"127.0.0.1:{port}",
        *extra,
    ]


class NodeProcess:
    """`python -m dspark_loop --node-rank I` (I > 0): the agent and, through it, its ranks."""

    def __init__(self, args: list[str], *, env: dict | None = None, prefix: list[str] | None = None):
        """prefix: how to start Python (default this interpreter; e.g. under `ip netns exec`)."""
        self.log_path = os.path.join("/tmp", f"dspark-e2e-node-{os.getpid()}-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(
            [*(prefix or [sys.executable]), "-m", "dspark_loop", *args],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()

    def rank_pids(self) -> list[int]:
        return children_of(self.proc.pid)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def kill(self) -> list[int]:
        """SIGKILL the agent and its ranks at once, as a host that loses power; their pids."""
        pids = [self.proc.pid, *self.rank_pids()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        return pids

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        return self.proc.returncode
