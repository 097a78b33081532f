"""Start `python -m dspark_loop` as a real subprocess for end-to-end tests.

s = ServerProcess(["--model", ckpt, "--dp", "2", "--tp", "2", "--ep", "4"])
s.post("/v1/completions", {...}) -> (status, json)     s.get(path) -> (status, text)
s.rank_pids()   the rank processes (the server's children)
s.engine_stats() / s.wait_idle()   the page pools, from GET /metrics/json
s.stop(signal.SIGTERM) -> exit code
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of(pid: int) -> list[int]:
    """Live child processes of pid (from /proc: no psutil)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # NOTE: the command name (field 2) may hold spaces; fields after its ")" are fixed.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(name))
    return sorted(out)


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive after waiting up to timeout_s for them to exit."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if is_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if is_alive(p)]
    return alive


class ServerProcess:
    def __init__(self, args: list[str], *, timeout_s: float = 180.0, env: dict | None = None, wait: bool = True):
        """wait=False: return at once; call wait_ready() (a test starting another node first)."""
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join("/tmp", f"dspark-e2e-{self.port}.log")
        self._log = open(self.log_path, "w+")
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dspark_loop", "--port", str(self.port), *args],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
        self.ready_s, self.ranks = None, []
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        self.ready_s = self._wait_ready(timeout_s)
        self.ranks = self.rank_pids()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started_at
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        with open(self.log_path) as f:
            return f.read()

    def post(
        self, path: str, body: dict | bytes, timeout: float = 120, headers: dict | None = None
    ) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def get(self, path: str, timeout: float = 10, headers: dict | None = None) -> tuple[int, str]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def complete(self, prompt, max_tokens: int, **extra) -> dict:
        """A greedy non-stream completion with token ids; asserts a 200."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "return_token_ids": True, **extra}
        status, out = self.post("/v1/completions", body)
        assert status == 200, (status, out)
        return out

    def rank_pids(self) -> list[int]:
        return children_of(self.proc.pid)

    def metrics_json(self) -> dict:
        status, text = self.get("/metrics/json")
        assert status == 200, text
        return json.loads(text)

    def engine_stats(self) -> dict:
        return self.metrics_json()["engine"]

    def wait_idle(self, timeout_s: float = 15.0) -> dict:
        """Engine stats once no request holds pages (every pool full), or the last seen."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.engine_stats()
            if pools_full(stats) or time.monotonic() > deadline:
                return stats
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode


def pools_full(stats: dict) -> bool:
    return (
        stats["num_requests"] == 0
        and stats["num_open_streams"] == 0
        and all(p["free"] == p["total"] for p in stats["partitions"])
    )
