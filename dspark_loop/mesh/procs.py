"""The rank processes the server spawned on this host: start, watch, stop, reap.

Each rank is `python -m workers ...` in its own session (so Ctrl-C on the server's
terminal reaches only the server, which then shuts the ranks down in order) and with
--parent-pid set (so a rank whose server died exits by itself). Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys

log = logging.getLogger("dspark_loop.mesh.mesh")


def rank_env(base: dict[str, str], threads: int) -> dict[str, str]:
    """A rank process's environment: OpenMP is configured before torch is imported in the
    rank (it sizes its pool at import); a value the user set wins."""
    env = dict(base)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    # NOTE: OpenMP threads that wait at a barrier sleep instead of spinning. With spinning
    # (libgomp's default), a CPU rank whose second thread is preempted -- the server, another
    # rank or any other process on the core -- stalls every parallel op: a 9k-token prefill
    # took 7 s instead of 1.2 s on a busy 2-core machine. Small steps run on one thread anyway.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


class RankProcs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.first_rank = 0  # procs[i] is rank first_rank + i (a node runs a block of ranks)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def spawn(self, argvs: list[list[str]], env: dict[str, str], first_rank: int = 0) -> None:
        self.first_rank = first_rank
        for rank, argv in enumerate(argvs, start=first_rank):
            proc = subprocess.Popen(
                [sys.executable, "-m", "workers", *argv], env=env, start_new_session=True, stdin=subprocess.DEVNULL
            )
            self.procs.append(proc)
            log.info("rank %d spawned (pid %d)", rank, proc.pid)

    def exited(self) -> list[tuple[int, int]]:
        """(rank, exit code) of every rank that has exited; signal deaths first."""
        codes = [(r, p.poll()) for r, p in enumerate(self.procs, start=self.first_rank)]
        done = [(r, code) for r, code in codes if code is not None]
        return sorted(done, key=lambda rc: (rc[1] >= 0, rc[0]))

    def exit_reason(self) -> str | None:
        done = self.exited()
        if not done:
            return None
        rank, code = done[0]
        pid = self.procs[rank - self.first_rank].pid
        return f"rank {rank} (pid {pid}) exited with {describe_exit(code)}"

    def stopped(self) -> list[int]:
        """Ranks that are alive but stopped (SIGSTOP, a debugger): they will never answer."""
        return [r for r, p in enumerate(self.procs) if p.poll() is None and process_state(p.pid) in ("T", "t")]

    def hang_reason(self) -> str | None:
        stopped = self.stopped()
        if not stopped:
            return None
        rank = stopped[0]
        return f"rank {rank} (pid {self.procs[rank].pid}) is stopped (SIGSTOP?) and cannot answer"

    def signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:  # NOTE: the rank leads its own session: its group holds any helpers it forked.
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    try:
                        p.send_signal(sig)
                    except ProcessLookupError:
                        pass

    async def wait(self, timeout_s: float) -> bool:
        """True when every rank has exited within timeout_s (each is reaped by poll)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(p.poll() is None for p in self.procs):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def stop(self, grace_s: float) -> None:
        """Wait grace_s for ranks to exit on their own, then SIGTERM, then SIGKILL; reap all."""
        if await self.wait(grace_s):
            return
        self.signal_all(signal.SIGTERM)
        if await self.wait(2.0):
            return
        self.signal_all(signal.SIGKILL)
        await self.wait(5.0)

    async def kill(self) -> None:
        """SIGKILL every rank now and reap them."""
        self.signal_all(signal.SIGKILL)
        await self.wait(5.0)

    def kill_now(self) -> None:
        """Synchronous last resort (atexit, a crashed loop): SIGKILL and reap."""
        self.signal_all(signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("rank pid %d did not die on SIGKILL", p.pid)

    def log_exits(self) -> None:
        for rank, p in enumerate(self.procs, start=self.first_rank):
            if p.returncode is not None:
                log.info("rank %d (pid %d) exited with %s", rank, p.pid, describe_exit(p.returncode))


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (R, S, D, T, t, Z ...), or "" when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    # NOTE: the command name may hold spaces and parentheses; the state follows the last ")".
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3].decode()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
