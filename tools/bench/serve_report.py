"""The serving benchmark's figures: one cell's summary from what the client saw and the
server's counter deltas, the table, the token check across modes, and the plot.

    summarize(load, before, after) -> dict      (before/after: Scrape.read() dicts)
    check_tokens(cells) -> list of mismatches   table(cells) -> str   plot(cells, path)

Definitions (per cell, over the load's window):
    delivered tok/s   tokens the clients received / the load's wall time
    ceiling tok/s     tokens / the device's busy seconds (per step the slowest rank's work,
                      summed): what the device would deliver if the host never kept it waiting
    utilisation       delivered / ceiling (= device busy seconds / wall seconds)
    ITL               the gaps between a stream's chunks (a K=7 chunk carries several tokens)
    per-user tok/s    median over streams of (tokens - 1) / (last chunk - first chunk)
    host ms/step      a phase's wall seconds / steps (schedule, update = acceptance, deliver,
                      gather = waiting on the ranks)
    server CPU/step   the server process's CPU seconds / steps; "other" in the JSON is that
                      minus schedule, update and deliver (plan encoding, mesh client, HTTP,
                      SSE, detokenization, metrics); on a loaded machine the phases' wall
                      time includes time off the CPU, so "other" can come out negative
"""

from __future__ import annotations

import math

PHASES = ("schedule", "update", "deliver", "gather")


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between ranks; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def delta(after: dict, before: dict, key: str) -> float | None:
    if after.get(key) is None or before.get(key) is None:
        return None
    return after[key] - before[key]


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def per_user_tok_s(stream: dict) -> float | None:
    n, gaps = len(stream["token_ids"]), stream["gaps_s"]
    span = sum(gaps)
    return (n - 1) / span if n > 1 and span > 0 else None


def summarize(load: dict, before: dict, after: dict) -> dict:
    """load: serve_client's answer; before/after: counters (serve.Scrape.read())."""
    streams = load["streams"]
    tokens = sum(len(s["token_ids"]) for s in streams)
    wall = load["wall_s"]
    steps = delta(after, before, "steps")
    device = delta(after, before, "device_busy_s")
    server_cpu = delta(after, before, "server_cpu_s")
    phases = {p: ratio(delta(after, before, p), steps) for p in PHASES}
    host = [phases[p] for p in ("schedule", "update", "deliver")]
    other = None if None in host or server_cpu is None or not steps else server_cpu / steps - sum(host)
    users = [u for u in (per_user_tok_s(s) for s in streams) if u is not None]
    gaps = [g for s in streams for g in s["gaps_s"]]
    ttfts = [s["ttft_s"] for s in streams if s["ttft_s"] is not None]
    out = {
        "num_streams": len(streams),
        "num_errors": sum(1 for s in streams if s["error"]),
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall if wall else None,
        "per_user_tok_s": percentile(users, 50),
        "device_busy_s": device,
        "host_blocked_s": delta(after, before, "host_blocked_s"),
        "ceiling_tok_s": ratio(tokens, device),
        "utilisation": ratio(device, wall),
        "ttft_p50_ms": _ms(percentile(ttfts, 50)),
        "ttft_p99_ms": _ms(percentile(ttfts, 99)),
        "itl_p50_ms": _ms(percentile(gaps, 50)),
        "itl_p99_ms": _ms(percentile(gaps, 99)),
        "steps": steps,
        "step_ms": _ms(ratio(wall, steps)),
        "device_ms_per_step": _ms(ratio(device, steps)),
        "tokens_per_step": ratio(tokens, steps),
        "verify_rows_per_step": ratio(delta(after, before, "verify_rows"), steps),
        "accepted_len": ratio(delta(after, before, "accepted"), delta(after, before, "verifies")),
        "host_ms_per_step": {**{p: _ms(v) for p, v in phases.items()}, "other": _ms(other)},
        "server_cpu_ms_per_step": _ms(ratio(server_cpu, steps)),
        # a stream's chunk per step, or fewer when its consumer fell behind and merged steps:
        # the server's CPU per step falls with merging, its CPU per chunk does not
        "chunks": sum(s.get("num_chunks", 0) for s in streams),
        "server_cpu_us_per_chunk": _us(ratio(server_cpu, sum(s.get("num_chunks", 0) for s in streams))),
        "cpu_s": {
            "server": server_cpu,
            "ranks": delta(after, before, "ranks_cpu_s"),
            "client": load.get("client_cpu_s"),
        },
    }
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


def check_tokens(cells: list[dict]) -> list[str]:
    """Request i of a (profile, temperature, concurrency) cell has the same prompt and seed in
    every mode: its tokens must be equal across the modes. Mismatches, described."""
    reference: dict[tuple, tuple[str, list[int]]] = {}
    bad = []
    for cell in cells:
        for i, ids in enumerate(cell.get("token_ids", [])):
            key = (cell["profile"], cell["temperature"], cell["concurrency"], i)
            if key not in reference:
                reference[key] = (cell["name"], ids)
            elif reference[key][1] != ids:
                bad.append(f"request {i} at T={cell['temperature']}: {cell['name']} != {reference[key][0]}")
    return bad


COLUMNS = (
    ("profile", "profile", "{}"),
    ("mode", "mode", "{}"),
    ("T", "temperature", "{:g}"),
    ("streams", "concurrency", "{}"),
    ("tok/s", "tok_s", "{:.0f}"),
    ("ceiling", "ceiling_tok_s", "{:.0f}"),
    ("util", "utilisation", "{:.2f}"),
    ("user tok/s", "per_user_tok_s", "{:.1f}"),
    ("TTFT p50/p99 ms", ("ttft_p50_ms", "ttft_p99_ms"), "{:.0f}"),
    ("ITL p50/p99 ms", ("itl_p50_ms", "itl_p99_ms"), "{:.1f}"),
    ("dev ms/step", "device_ms_per_step", "{:.1f}"),
    ("rows/step", "verify_rows_per_step", "{:.0f}"),
    ("acc len", "accepted_len", "{:.2f}"),
    ("host sch/upd/del ms", "host", "{:.2f}"),
    ("srv CPU ms/step", "server_cpu_ms_per_step", "{:.1f}"),
    ("CPU s srv/ranks/cli", "cpu", "{:.1f}"),
)


def _cell_text(cell: dict, key, spec: str) -> str:
    def f(v):
        return "-" if v is None else spec.format(v)

    if key == "host":
        h = cell["host_ms_per_step"]
        return "/".join(f(h[p]) for p in ("schedule", "update", "deliver"))
    if key == "cpu":
        c = cell["cpu_s"]
        return "/".join(f(c[p]) for p in ("server", "ranks", "client"))
    if isinstance(key, tuple):
        return "/".join(f(cell.get(k)) for k in key)
    return f(cell.get(key))


def table(cells: list[dict]) -> str:
    rows = [[name for name, _, _ in COLUMNS]]
    rows += [[_cell_text(c, key, spec) for _, key, spec in COLUMNS] for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot(cells: list[dict], path: str) -> bool:
    """Per-user vs total tok/s, one curve per (profile, mode, temperature) along concurrency;
    False when matplotlib is not installed (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    curves: dict[tuple, list[tuple]] = {}
    for c in cells:
        if c.get("tok_s") and c.get("per_user_tok_s"):
            key = (c["profile"], c["mode"], c["temperature"])
            curves.setdefault(key, []).append((c["concurrency"], c["tok_s"], c["per_user_tok_s"]))
    profiles = sorted({k[0] for k in curves})
    modes = sorted({k[1] for k in curves})
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for (profile, mode, temperature), pts in sorted(curves.items()):
        pts.sort()
        style = {
            "color": f"C{modes.index(mode)}",  # colour: the mode; line: the profile; marker: greedy or not
            "linestyle": ("-", "--", ":", "-.")[profiles.index(profile) % 4],
            "marker": "o" if temperature == 0 else "s",
        }
        label = f"{profile} {mode} T={temperature:g}"
        ax.plot([p[1] for p in pts], [p[2] for p in pts], label=label, **style)
        for n, x, y in pts:
            ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("total output tok/s (all streams)")
    ax.set_ylabel("per-user output tok/s (median stream)")
    ax.set_title("Served throughput vs per-user speed (labels: concurrent streams)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
