"""Viewer for the engine's debug tap (dspark_loop.observe.tap_publisher.TapPublisher, --debug-tap ADDR).

    python -m tools.tap --connect tcp://127.0.0.1:5599             live table, every second
    python -m tools.tap --connect ADDR --jsonl run.jsonl --count N  record N traces
    python -m tools.tap --replay run.jsonl                          summary of a recording

The live table redraws in place on a terminal and prints plain blocks otherwise.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import msgspec
import numpy as np
import zmq

from dspark_loop.contract.protocol import TRACE_DECODER, PartitionTrace, StepTrace
from dspark_loop.observe.tap_publisher import tap_address

PHASES = ("schedule_s", "send_s", "compute_max_s", "compute_min_s", "gather_s", "update_s", "deliver_s")
WINDOW_S = 10.0  # the live view's percentiles cover this many seconds of traces


# ---- JSON lines: one object per trace, keyed by field name (not the wire's arrays) ----


def trace_to_dict(trace: StepTrace) -> dict:
    out = msgspec.structs.asdict(trace)
    out["partitions"] = [msgspec.structs.asdict(p) for p in trace.partitions]
    return out


def trace_from_dict(d: dict) -> StepTrace:
    # NOTE: fields this version does not know (a newer recording) are ignored, not fatal.
    parts = [PartitionTrace(**_known(PartitionTrace, p)) for p in d.get("partitions", [])]
    return StepTrace(**{**_known(StepTrace, d), "partitions": parts})


def _known(cls, d: dict) -> dict:
    return {k: v for k, v in d.items() if k in cls.__struct_fields__}


def read_jsonl(path: str) -> list[StepTrace]:
    with open(path, "rb") as f:
        return [trace_from_dict(msgspec.json.decode(line)) for line in f if line.strip()]


# ---- figures over a list of traces ----


def verify_lens(trace: StepTrace) -> list[int]:
    """Accepted lengths of the requests that verified drafts (all decode requests when the
    trace does not say which did)."""
    drafts = trace.accepted_num_drafts
    if len(drafts) != len(trace.accepted_lens):
        return list(trace.accepted_lens)
    return [a for a, d in zip(trace.accepted_lens, drafts) if d > 0]


def percentiles(values: list[float], qs=(50, 90, 99)) -> list[float]:
    if not values:
        return [0.0] * len(qs)
    return [float(v) for v in np.percentile(np.asarray(values, np.float64), qs)]


def acceptance_histogram(traces: list[StepTrace]) -> collections.Counter:
    return collections.Counter(a for t in traces for a in verify_lens(t))


def mean_accepted_len(traces: list[StepTrace]) -> float:
    lens = [a for t in traces for a in verify_lens(t)]
    return sum(lens) / len(lens) if lens else 0.0


def partition_load(traces: list[StepTrace]) -> list[tuple[int, int, list[int]]]:
    """Per partition: prefill tokens and decode rows summed over traces, the last free blocks."""
    num_parts = max((len(t.partitions) for t in traces), default=0)
    load = [[0, 0, []] for _ in range(num_parts)]
    for t in traces:
        for p, part in enumerate(t.partitions):
            load[p][0] += sum(part.prefill_num_tokens)
            load[p][1] += part.decode_num_rows
            load[p][2] = list(part.free_blocks)
    return [tuple(x) for x in load]


def summary(traces: list[StepTrace]) -> str:
    """The --replay report: totals, rates, phase-time percentiles, acceptance lengths."""
    if not traces:
        return "no traces\n"
    n = len(traces)
    duration = traces[-1].wall_time - traces[0].wall_time
    tokens = sum(t.num_new_tokens for t in traces)
    reasons = collections.Counter(r for t in traces for r in t.finished_reasons)
    lines = [
        f"steps {n}  (step ids {traces[0].step_id}..{traces[-1].step_id})  duration {duration:.3f} s",
        f"tokens {tokens}  "
        + (f"steps/s {(n - 1) / duration:.1f}  tokens/s {tokens / duration:.1f}" if duration > 0 else ""),
        f"preemptions {sum(len(t.preempted_req_ids) for t in traces)}  "
        f"aborted {sum(len(t.aborted_req_ids) for t in traces)}  "
        f"finished {dict(sorted(reasons.items()))}  "
        f"errors {sum(len(t.errors) for t in traces)}  "
        f"dropped traces {max(t.dropped_traces for t in traces)}",
        "",
        f"{'phase (ms)':<14}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}",
    ]
    for phase in PHASES:
        ms = [getattr(t, phase) * 1e3 for t in traces]
        p50, p90, p99 = percentiles(ms)
        lines.append(f"{phase[:-2]:<14}{sum(ms) / n:9.3f}{p50:9.3f}{p90:9.3f}{p99:9.3f}{max(ms):9.3f}")
    hist = acceptance_histogram(traces)
    total = sum(hist.values())
    lines += ["", f"accepted length  (mean {mean_accepted_len(traces):.3f} over {total})"]
    for a in range(1, max(hist, default=0) + 1):
        share = hist[a] / total
        lines.append(f"{a:>4} {hist[a]:>8} {100 * share:6.1f}%  {'#' * round(40 * share)}")
    verifies = sum(1 for t in traces for d in t.accepted_num_drafts if d)
    drafts = sum(sum(t.accepted_num_drafts) for t in traces)
    rows = sum(part.verify_rows for t in traces for part in t.partitions)
    skips = sum(part.num_drafter_skips for t in traces for part in t.partitions)
    if verifies or skips:
        lines.append(
            f"verifies {verifies}  drafts verified {drafts} (mean window {drafts / max(verifies, 1):.2f})  "
            f"verify rows {rows} ({rows / n:.1f} per step)  drafter passes skipped {skips}"
        )
    lines += overlap_lines(traces)
    lines += ["", "partition  prefill_tokens  decode_rows  free_blocks(last)"]
    for p, (prefill, rows, free) in enumerate(partition_load(traces)):
        lines.append(f"{p:>9}  {prefill:>14}  {rows:>11}  {free}")
    return "\n".join(lines) + "\n"


def overlap_lines(traces: list[StepTrace]) -> list[str]:
    """Async scheduling: steps planned ahead, the rows the ranks filled (placeholders),
    the windows they started, and the rows wasted on requests that ended meanwhile."""
    ahead = [t for t in traces if t.overlapped]
    if not ahead:
        return []
    parts = [p for t in ahead for p in t.partitions]
    rows = sum(p.decode_num_rows for p in parts)
    wasted = sum(p.num_wasted_rows for p in parts)
    return [
        "",
        f"overlap  steps planned ahead {len(ahead)}/{len(traces)}  "
        f"placeholder rows {sum(p.num_placeholder_rows for p in parts)}/{rows}  "
        f"open starts {sum(p.num_open_starts for p in parts)}  "
        f"wasted rows {wasted} ({sum(len(p.wasted_req_ids) for p in parts)} requests, "
        f"{100 * wasted / max(1, rows):.2f}%)",
    ]


# ---- live view ----


class LiveView:
    """Keeps the last WINDOW_S seconds of (receive time, trace) and renders the table."""

    def __init__(self):
        self.window: collections.deque[tuple[float, StepTrace]] = collections.deque()
        self.num_received = 0

    def add(self, trace: StepTrace, now: float) -> None:
        self.window.append((now, trace))
        self.num_received += 1

    def render(self, now: float, interval_s: float = 1.0) -> str:
        while self.window and self.window[0][0] < now - WINDOW_S:
            self.window.popleft()
        recent = [t for ts, t in self.window if ts >= now - interval_s]
        every = [t for _, t in self.window]
        last = every[-1] if every else None
        lines = [
            time.strftime("%H:%M:%S")
            + f"  traces {self.num_received}"
            + (
                f"  step {last.step_id}  running {last.num_running}  waiting "
                f"{last.num_waiting}  dropped {last.dropped_traces}"
                if last
                else "  (waiting for traces)"
            ),
            f"steps/s {len(recent) / interval_s:8.1f}   tokens/s "
            f"{sum(t.num_new_tokens for t in recent) / interval_s:9.1f}   "
            f"mean accepted len {mean_accepted_len(every):.3f}",
            f"{'partition':<10}{'prefill tok/s':>14}{'decode rows/s':>14}  free blocks",
        ]
        for p, (prefill, rows, free) in enumerate(partition_load(recent)):
            lines.append(f"{p:<10}{prefill / interval_s:14.1f}{rows / interval_s:14.1f}  {free}")
        lines.append(f"{'phase (ms)':<14}{'p50':>9}{'p99':>9}   over the last {WINDOW_S:.0f} s")
        for phase in PHASES:
            p50, p99 = percentiles([getattr(t, phase) * 1e3 for t in every], (50, 99))
            lines.append(f"{phase[:-2]:<14}{p50:9.3f}{p99:9.3f}")
        return "\n".join(lines) + "\n"


def record(addr: str, jsonl: str | None, count: int | None, out=sys.stdout, interval_s: float = 1.0) -> int:
    """Subscribe at addr; show the live view; write traces to jsonl; stop after count."""
    tty = out.isatty()
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(tap_address(addr))
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    view = LiveView()
    sink = open(jsonl, "wb") if jsonl else None
    next_draw = time.monotonic() + interval_s
    try:
        while count is None or view.num_received < count:
            timeout_ms = max(0, int((next_draw - time.monotonic()) * 1e3))
            if sock.poll(timeout_ms, zmq.POLLIN):
                while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN and (count is None or view.num_received < count):
                    trace = TRACE_DECODER.decode(sock.recv(zmq.NOBLOCK))
                    view.add(trace, time.monotonic())
                    if sink:
                        sink.write(msgspec.json.encode(trace_to_dict(trace)) + b"\n")
            now = time.monotonic()
            if now >= next_draw:
                next_draw = now + interval_s
                table = view.render(now, interval_s)
                out.write("\x1b[H\x1b[2J" + table if tty else table + "\n")
                out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        if sink:
            sink.close()
        sock.close(0)
    if jsonl:
        out.write(f"recorded {view.num_received} traces to {jsonl}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m tools.tap", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--connect",
        metavar="ADDR",
        type=tap_connect,
        help="the server's --debug-tap address (a bare port means loopback)",
    )
    src.add_argument("--replay", metavar="FILE", help="summarise a --jsonl recording")
    ap.add_argument("--jsonl", metavar="FILE", help="record traces as JSON lines")
    ap.add_argument("--count", type=int, metavar="N", help="stop after N traces")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between redraws")
    return ap


def tap_connect(text: str) -> str:
    try:
        return tap_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None, out=sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    if args.replay:
        out.write(summary(read_jsonl(args.replay)))
        return 0
    return record(args.connect, args.jsonl, args.count, out, args.interval)


if __name__ == "__main__":
    sys.exit(main())
