"""Start smg (the Shepherd Model Gateway, `pip install smg`) in front of e2e replicas.

r = SmgRouter([a.url, b.url], "cache_aware")   waits until smg holds both as healthy
r.url   r.workers() -> {worker url: smg's record}   r.healthy(url)   r.log()   r.stop()
r.metric("smg_worker_retries_total") -> the sum of its samples on smg's Prometheus port
smg_binary() -> its path, or None (the tests skip then)

Health is probed every second (smg's default is 60 s) and loads polled every second, so
a test sees smg react within seconds; everything else is smg's default.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

from dspark_testing.server_process import free_port

FAST_PROBES = ["--health-check-interval-secs", "1", "--load-monitor-interval", "1"]


def smg_binary() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "smg")  # the venv's console script
    return beside if os.access(beside, os.X_OK) else shutil.which("smg")


class SmgRouter:
    def __init__(self, worker_urls: list[str], policy: str, *extra: str, timeout_s: float = 60.0):
        self.worker_urls = list(worker_urls)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join("/tmp", f"dspark-e2e-smg-{self.port}.log")
        self._log = open(self.log_path, "w+")
        args = [smg_binary() or "smg", "launch", "--host", "127.0.0.1", "--port", str(self.port)]
        metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        args += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
        args += ["--worker-urls", *self.worker_urls, "--policy", policy, *FAST_PROBES, *extra]
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ})
        self.wait_healthy(self.worker_urls, timeout_s)

    def workers(self) -> dict[str, dict]:
        """smg's GET /workers, by worker url ({} while smg does not answer)."""
        try:
            with urllib.request.urlopen(self.url + "/workers", timeout=5) as r:
                return {w["url"]: w for w in json.loads(r.read())["workers"]}
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
            return {}

    def metric(self, name: str, **labels: str) -> float:
        """The sum of smg's samples of `name` whose labels include `labels`."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def healthy(self, url: str) -> bool:
        w = self.workers().get(url)
        return bool(w and w.get("is_healthy") and w.get("status") == "ready")

    def wait_healthy(self, urls: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(self.healthy(u) for u in urls):
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"smg did not hold {urls} healthy in {timeout_s}s:\n{self.log()[-4000:]}")
            time.sleep(0.2)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode
