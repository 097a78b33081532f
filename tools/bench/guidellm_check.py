"""A cross-check of tools.bench.serve by a third-party client: guidellm on one cell.

    python -m tools.bench.guidellm_check [--guidellm PATH] [--model DIR] [--profile npu-tile]
        [--mode k0|k7|adaptive] [--concurrency 64] [--prompt-len 64] [--max-tokens 128]
        [--requests 320] [--endpoint /v1/completions] [--workers N] [--out DIR]

Starts the server the way tools.bench.serve does for a cell (the sim backend, the seeds'
16-rank topology, the mode's speculative config), warms it with one wave of our own client,
then runs guidellm in concurrency mode (`concurrent`, N streams kept in flight) against
/v1/completions with synthetic prompts of --prompt-len tokens and exactly --max-tokens
output tokens (guidellm sends ignore_eos), greedy (the server's default temperature for a
request without one is the model's; the cell passes temperature=0 through guidellm's extras).
guidellm's own console report is printed and its JSON lands in --out. Then one wave of our
client (tools.bench.serve's cell) runs on the same server, and a two-row table compares them:
req/s, output tok/s, TTFT and ITL p50/p99 as each client defines them, chunks per request,
and the server's own TTFT/ITL means over each client's window (docs/benchmarks.md).

guidellm is NOT a dependency of this project (it pulls torch and transformers). Install it
into a venv of its own and point --guidellm at it (or put it on PATH):

    python3.11 -m venv /tmp/gl-venv && /tmp/gl-venv/bin/pip install guidellm
    python -m tools.bench.guidellm_check --guidellm /tmp/gl-venv/bin/guidellm

It needs no model hub: its tokenizer (for the synthetic prompts) is the checkpoint's own
tokenizer.json, loaded from --model with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from tools.bench import serve, serve_report

NOT_INSTALLED = """guidellm was not found ({where}).
It is not a dependency of this project; install it into a venv of its own:
    python3.11 -m venv /tmp/gl-venv && /tmp/gl-venv/bin/pip install guidellm
then run this again with --guidellm /tmp/gl-venv/bin/guidellm (or put it on PATH)."""


def find_guidellm(path: str | None) -> str | None:
    """The guidellm executable: --guidellm, else $GUIDELLM, else `guidellm` on PATH."""
    path = path or os.environ.get("GUIDELLM") or "guidellm"
    found = shutil.which(path)
    return found if found and os.access(found, os.X_OK) else None


def scenario(url: str, args) -> dict:
    """guidellm's scenario file (its `run --scenario` format, 0.8) for the cell."""
    return {
        "metadata": {"name": f"dspark {args.profile} {args.mode} {args.concurrency} streams"},
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": url,
                "request_format": args.endpoint,
                "extras": {"body": {"temperature": 0.0}},
            },
            "profile": {"kind": "concurrent", "streams": args.concurrency},
            "tokenizer": {"kind": "huggingface_auto", "model": args.model},
            "data": [{"kind": "synthetic_text", "prompt_tokens": args.prompt_len, "output_tokens": args.max_tokens}],
            "constraints": [{"kind": "max_requests", "count": args.requests}],
            "outputs": [{"kind": "console"}, {"kind": "json", "path": os.path.join(args.out, "guidellm.json")}],
        },
    }


def run_guidellm(exe: str, url: str, args) -> tuple[int, float]:
    """guidellm's exit status and the CPU seconds it (all its processes) used."""
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "scenario.json")
    with open(path, "w") as f:
        json.dump(scenario(url, args), f, indent=1)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if args.workers:
        env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(args.workers)
    cmd = [exe, "run", "--scenario", path, "--disable-console-interactive"]
    print("$ " + " ".join(cmd), flush=True)
    before = children_cpu_s()
    rc = subprocess.run(cmd, env=env, timeout=args.timeout).returncode
    return rc, children_cpu_s() - before


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (guidellm and the processes it spawned)."""
    t = os.times()
    return t.children_user + t.children_system


def guidellm_row(path: str) -> dict:
    """The cell's figures from guidellm's JSON report (its definitions: see docs/benchmarks.md)."""
    with open(path) as f:
        bench = json.load(f)["benchmarks"][0]
    m = bench["metrics"]

    def stat(name: str, q: str | None = None) -> float | None:
        s = m[name]["successful"]
        return s["mean"] if q is None else s["percentiles"][q]

    return {
        "client": "guidellm",
        "requests": m["request_totals"]["successful"],
        "errors": m["request_totals"]["errored"],
        "req_s": stat("requests_per_second"),
        "tok_s": stat("output_tokens_per_second"),
        "ttft": (stat("time_to_first_token_ms", "p50"), stat("time_to_first_token_ms", "p99")),
        "itl": (stat("inter_token_latency_ms", "p50"), stat("inter_token_latency_ms", "p99")),
        "chunks_per_request": stat("request_streaming_iterations_count", "p50"),
    }


def our_row(load: dict) -> dict:
    """The same figures from one wave of tools.bench.serve's client (ITL: gaps between chunks)."""
    cell = serve_report.summarize(load, {}, {})
    n = cell["num_streams"]
    chunks = sorted(s.get("num_chunks", 0) for s in load["streams"])
    return {
        "client": "tools.bench.serve",
        "requests": n - cell["num_errors"],
        "errors": cell["num_errors"],
        "req_s": n / load["wall_s"],
        "tok_s": cell["tok_s"],
        "ttft": (cell["ttft_p50_ms"], cell["ttft_p99_ms"]),
        "itl": (cell["itl_p50_ms"], cell["itl_p99_ms"]),
        "chunks_per_request": serve_report.percentile(chunks, 50),
    }


def server_latencies(server) -> dict:
    """The server's own TTFT and ITL histograms' (sum, count): arrival to first token, token to token."""
    snap = server.metrics_json()
    hist = ("time_to_first_token_seconds", "inter_token_latency_seconds")
    return {h: (snap[h]["sum"], snap[h]["count"]) for h in hist}


def server_means_ms(before: dict, after: dict) -> tuple[float | None, float | None]:
    """The server-side mean TTFT and ITL over a window, in ms."""
    out = []
    for h in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        n = after[h][1] - before[h][1]
        out.append(1000.0 * (after[h][0] - before[h][0]) / n if n else None)
    return out[0], out[1]


def rows_table(rows: list[dict]) -> str:
    def f(v, spec="{:.1f}"):
        return "-" if v is None else spec.format(v)

    head = ["client", "ok/err", "req/s", "out tok/s", "TTFT p50/p99 ms", "ITL p50/p99 ms", "chunks/req"]
    head += ["server TTFT/ITL mean ms"]
    lines = [head]
    for r in rows:
        lines.append(
            [
                r["client"],
                f"{r['requests']}/{r['errors']}",
                f(r["req_s"], "{:.2f}"),
                f(r["tok_s"], "{:.0f}"),
                "/".join(f(v, "{:.0f}") for v in r["ttft"]),
                "/".join(f(v) for v in r["itl"]),
                f(r["chunks_per_request"], "{:.0f}"),
                "/".join(f(v) for v in r["server"]),
            ]
        )
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    text = ["  ".join(v.rjust(w) for v, w in zip(x, widths)) for x in lines]
    text.insert(1, "-" * len(text[0]))
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.guidellm_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--guidellm", default=None, help="the guidellm executable (default: $GUIDELLM, else PATH)")
    ap.add_argument("--model", default=None, help="checkpoint (default: the Flash shape without weights)")
    ap.add_argument("--profile", default="npu-tile", help="sim device profile")
    ap.add_argument("--mode", default="k0", choices=list(serve.MODES))
    ap.add_argument("--concurrency", type=int, default=64, help="streams guidellm keeps in flight")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=320, help="requests in all (5 waves of 64 by default)")
    ap.add_argument("--server-args", default=" ".join(serve.SEEDS_TOPOLOGY))
    ap.add_argument("--out", default="bench-guidellm")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds guidellm may run")
    ap.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    ap.add_argument("--workers", type=int, default=None, help="guidellm's worker processes (its default: 10)")
    args = ap.parse_args(argv)
    exe = find_guidellm(args.guidellm)
    if exe is None:
        print(NOT_INSTALLED.format(where=args.guidellm or os.environ.get("GUIDELLM") or "not on PATH"), file=sys.stderr)
        return 2
    args.model = os.path.abspath(args.model or serve.default_model("sim"))
    from dspark_loop.contract.model_config import ModelConfig
    from dspark_testing.server_process import ServerProcess

    vocab_size = ModelConfig.from_dir(args.model).vocab_size
    server_args = ["--log-level", "warning", "--backend", "sim", "--model", args.model]
    server_args += ["--device-profile", args.profile, "--speculative-config", json.dumps(serve.MODES[args.mode])]
    server_args += args.server_args.split()
    t0 = time.monotonic()
    server = ServerProcess(server_args, timeout_s=600)
    print(
        f"... {args.profile} {args.mode}: up in {time.monotonic() - t0:.1f}s, {len(server.ranks)} rank(s)", flush=True
    )
    try:
        warm = argparse.Namespace(prompt_len=args.prompt_len, max_tokens=args.max_tokens)
        serve.run_client(server.url, serve.request_bodies(args.concurrency, 0.0, 999, warm, vocab_size), 600)
        load0, scrape = os.getloadavg(), serve.Scrape(server)
        before, lat0 = scrape.read(), server_latencies(server)
        rc, guidellm_cpu = run_guidellm(exe, server.url, args)
        after, lat1 = scrape.read(), server_latencies(server)
        load1 = os.getloadavg()
        bodies = serve.request_bodies(args.concurrency, 0.0, 0, warm, vocab_size)
        ours = serve.run_client(server.url, bodies, 600)  # one wave of tools.bench.serve's cell, same server
        lat2 = server_latencies(server)
    finally:
        server.stop()
    if rc != 0:
        print(f"guidellm failed (exit status {rc}); its output is above", file=sys.stderr)
        return rc
    rows = [guidellm_row(os.path.join(args.out, "guidellm.json")), our_row(ours)]
    rows[0]["server"], rows[1]["server"] = server_means_ms(lat0, lat1), server_means_ms(lat1, lat2)
    steps = serve_report.delta(after, before, "steps")
    busy = round(serve_report.delta(after, before, "device_busy_s") or 0.0, 1)
    server_cpu = round(serve_report.delta(after, before, "server_cpu_s") or 0.0, 1)
    print(f"\n{rows_table(rows)}\n")
    print(f"guidellm window: {steps} server steps, device busy {busy}s, server CPU {server_cpu}s;")
    print(f"guidellm's CPU {guidellm_cpu:.1f}s (start-up included), our client's {ours['client_cpu_s']:.1f}s")
    print(f"load average (1 min) before/after guidellm: {load0[0]:.2f} / {load1[0]:.2f} on {os.cpu_count()} CPUs")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(
            {
                "rows": rows,
                "server": {"before": before, "after": after},
                "guidellm_cpu_s": guidellm_cpu,
                "client_cpu_s": ours["client_cpu_s"],
                "loadavg": [load0, load1],
            },
            f,
            indent=1,
        )
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
