"""The served system at the device's pace: N concurrent streams over HTTP, per cell.

    python -m tools.bench.serve [--backend sim|cpu|...] [--model DIR] [--profiles npu-tile,gpu-h200]
        [--concurrency 1,16,64,256] [--temperatures 0,0.8] [--modes k0,k7,adaptive]
        [--max-tokens 64] [--prompt-len 64] [--server-args "--dp 4 --tp 4 --ep 16"]
        [--json bench-serve.json] [--plot bench-serve.png]

One server per (profile, mode): k0 = no drafting, k7 = the fixed K=7 chain, adaptive = K=7
under adaptive verification. Per cell (temperature x concurrency) a separate client process
(tools/bench/serve_client.py) sends every stream at once (fixed prompts, ignore_eos, a fixed
max_tokens, seed = the request's index), and the server's counters are read before and after
(/metrics, /metrics/json, /proc CPU times of the server and its ranks). The figures and their
definitions: tools/bench/serve_report.py. Request i of a cell has the same prompt and seed in
every mode: its tokens must be equal across modes (checked, listed in the JSON).

Default: the simulated device (`--backend sim`) with the Flash shape without weights (made
once by tools.make_checkpoint) on the seeds' 16-rank topology; without the sim, the cpu
backend and the embedded demo model on one rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from tools.bench import serve_report

MODES = {
    "k0": {"method": "dspark", "num_speculative_tokens": 0},
    "k7": {"method": "dspark", "num_speculative_tokens": 7, "enable_adaptive_verification": False},
    "adaptive": {"method": "dspark", "num_speculative_tokens": 7, "enable_adaptive_verification": True},
}
SEEDS_TOPOLOGY = ["--dp", "4", "--tp", "4", "--ep", "16", "--max-num-seqs", "256"]  # 16 devices, 256 streams
FLASH_DIR = os.path.join(os.path.expanduser("~"), ".cache", "dspark-bench", "flash-no-weights")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process, in seconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def prometheus_values(text: str) -> dict[str, float]:
    """`name{...,phase="x",...} v` -> {"name" or "name/x": v} for the dspark: samples."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("dspark:"):
            continue
        sample, _, value = line.rpartition(" ")
        name = sample.split("{", 1)[0]
        if 'phase="' in sample:
            name += "/" + sample.split('phase="', 1)[1].split('"', 1)[0]
        out[name] = float(value)
    return out


class Scrape:
    """The server's counters a cell's summary needs, read outside the load window."""

    def __init__(self, server):
        self.server = server

    def read(self) -> dict:
        status, text = self.server.get("/metrics")
        prom = prometheus_values(text) if status == 200 else {}
        snap = self.server.metrics_json()
        spec = snap.get("engine", {}).get("dspark", {})
        phase = "dspark:step_phase_seconds_total/"
        device = prom.get("dspark:device_busy_seconds_total")
        return {
            "steps": snap.get("num_steps"),
            "device_busy_s": device,
            "host_blocked_s": prom.get("dspark:host_blocked_seconds_total"),
            **{p: prom.get(phase + p) for p in serve_report.PHASES},
            "verify_rows": spec.get("num_verify_rows"),
            "verifies": spec.get("num_verify_steps"),
            "accepted": spec.get("num_accepted"),
            "server_cpu_s": proc_cpu_s(self.server.pid),
            "ranks_cpu_s": sum(proc_cpu_s(p) for p in self.server.rank_pids()),
        }


def prompt_ids(n: int, index: int, vocab_size: int) -> list[int]:
    """A fixed prompt of n ids, distinct per index (no prefix shared between streams)."""
    return [2 + (index * 7919 + i * 104729) % (vocab_size - 2) for i in range(n)]


def request_bodies(n: int, temperature: float, cell_index: int, args, vocab_size: int) -> list[dict]:
    """Fixed, distinct prompts per cell (no prefix hits between cells); seed = index."""
    base = 1000 * cell_index
    return [
        {
            "prompt": prompt_ids(args.prompt_len, base + i, vocab_size),
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "return_token_ids": True,
            "temperature": temperature,
            "seed": i,
        }
        for i in range(n)
    ]


def run_client(url: str, bodies: list[dict], timeout_s: float) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"url": url, "bodies": bodies, "timeout_s": timeout_s}, f)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tools.bench.serve_client", f.name],
            capture_output=True,
            text=True,
            timeout=timeout_s + 60,
        )
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"the client failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def bench_server(profile: str, mode: str, args, vocab_size: int) -> list[dict]:
    """One server, every cell of (temperature x concurrency) for it."""
    from dspark_testing.server_process import ServerProcess

    server_args = ["--log-level", "warning", "--backend", args.backend, "--speculative-config", json.dumps(MODES[mode])]
    if args.model:
        server_args += ["--model", args.model]
    if args.backend == "sim":
        server_args += ["--device-profile", profile]
        if args.sim_speed:
            server_args += ["--sim-speed", str(args.sim_speed)]
    server_args += args.server_args.split()
    t0 = time.monotonic()
    server = ServerProcess(server_args, timeout_s=args.startup_timeout)
    print(f"... {profile} {mode}: up in {time.monotonic() - t0:.1f}s, {len(server.ranks)} rank(s)", flush=True)
    cells = []
    try:
        run_client(server.url, request_bodies(min(16, max(args.concurrency)), 0.0, 999, args, vocab_size), 600)
        scrape = Scrape(server)
        for ti, temperature in enumerate(args.temperatures):
            for ci, n in enumerate(args.concurrency):
                bodies = request_bodies(n, temperature, ti * 100 + ci, args, vocab_size)
                before = scrape.read()
                load = run_client(server.url, bodies, args.cell_timeout)
                after = scrape.read()
                cell = {"profile": profile, "mode": mode, "temperature": temperature, "concurrency": n}
                cell["name"] = f"{profile}/{mode}/T={temperature:g}/{n}"
                cell.update(serve_report.summarize(load, before, after))
                cell["token_ids"] = [s["token_ids"] for s in load["streams"]]
                errors = [s["error"] for s in load["streams"] if s["error"]]
                if errors:
                    cell["first_error"] = errors[0]
                print(serve_report.table([cell]).splitlines()[-1], flush=True)
                cells.append(cell)
    finally:
        server.stop()
    return cells


def default_model(backend: str) -> str | None:
    """The Flash shape without weights for the sim (made once), else the embedded demo."""
    if backend != "sim":
        return None
    if not os.path.exists(os.path.join(FLASH_DIR, "config.json")):
        cmd = [sys.executable, "-m", "tools.make_checkpoint", FLASH_DIR, "--size", "flash", "--no-weights"]
        subprocess.run([*cmd, "--with-drafter"], check=True)
    return FLASH_DIR


def sim_available() -> bool:
    out = subprocess.run([sys.executable, "-m", "dspark_loop", "--help"], capture_output=True, text=True)
    return "sim" in out.stdout.split("--backend", 2)[1][:40] if "--backend" in out.stdout else False


def csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m tools.bench.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default=None, help="default: sim when this build has it, else cpu")
    ap.add_argument("--model", default=None, help="checkpoint (default: Flash without weights on sim, else the demo)")
    ap.add_argument("--profiles", type=csv(str), default=["npu-tile"], help="sim device profiles")
    ap.add_argument("--sim-speed", type=float, default=None)
    ap.add_argument("--concurrency", type=csv(int), default=None, help="default 1,16,64,256 (sim) or 1,16,64 (cpu)")
    ap.add_argument("--temperatures", type=csv(float), default=[0.0, 0.8])
    ap.add_argument("--modes", type=csv(str), default=list(MODES))
    ap.add_argument("--max-tokens", type=int, default=None, help="per stream (default 64 on sim, 32 on cpu)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--server-args", default=None, help="extra server flags (default: the seeds' 16 ranks on sim)")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--cell-timeout", type=float, default=900.0)
    ap.add_argument("--json", default="bench-serve.json")
    ap.add_argument("--plot", default="bench-serve.png")
    args = ap.parse_args(argv)
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        ap.error(f"--modes must be among {list(MODES)} (got {bad})")
    args.backend = args.backend or ("sim" if sim_available() else "cpu")
    sim = args.backend == "sim"
    if args.concurrency is None:
        args.concurrency = [1, 16, 64, 256] if sim else [1, 16, 64]
    args.max_tokens = args.max_tokens or (64 if sim else 32)
    if args.server_args is None:
        args.server_args = " ".join(SEEDS_TOPOLOGY) if sim else ""
    if not sim:
        args.profiles = [args.backend]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from dspark_loop.config.default_model import default_model_dir  # noqa: PLC0415 -- the demo's path
    from dspark_loop.contract.model_config import ModelConfig

    args.model = args.model or default_model(args.backend)
    vocab_size = ModelConfig.from_dir(args.model or default_model_dir()).vocab_size
    started = time.time()
    cells = []
    for profile in args.profiles:
        for mode in args.modes:
            cells += bench_server(profile, mode, args, vocab_size)
    mismatches = serve_report.check_tokens(cells)
    print(f"\n{serve_report.table(cells)}\n")
    print(f"tokens equal across modes: {'yes' if not mismatches else 'NO: ' + '; '.join(mismatches[:5])}")
    report = {
        "command": "python -m tools.bench.serve " + " ".join(sys.argv[1:] if argv is None else argv),
        "backend": args.backend,
        "model": args.model,
        "cpus": os.cpu_count(),
        "loadavg_end": os.getloadavg(),
        "seconds": time.time() - started,
        "tokens_equal": not mismatches,
        "mismatches": mismatches,
        "cells": [{k: v for k, v in c.items() if k != "token_ids"} for c in cells],
    }
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    drew = serve_report.plot(cells, args.plot)
    print(f"wrote {args.json}" + (f" and {args.plot}" if drew else " (no plot: pip install matplotlib)"))
    return 0 if not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
