"""python -m tools.tap: recording from a live publisher, replay summaries, the live table."""

import io
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from dspark_loop.contract.protocol import PartitionTrace
from dspark_loop.observe.tap_publisher import TapPublisher
from tests.unit.observe.factories import make_trace
from tools import tap

REPO = Path(__file__).resolve().parents[3]  # tools/ is run from a checkout, not installed


def run_main_in_thread(argv: list[str]):
    out = io.StringIO()
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("rc", tap.main(argv, out=out)), daemon=True)
    th.start()
    return th, out, result


def feed_until_done(pub: TapPublisher, th: threading.Thread, limit_s: float = 20.0) -> dict:
    """Publish a trace every millisecond until the viewer thread exits; {step_id: trace}."""
    sent, step = {}, 0
    deadline = time.monotonic() + limit_s
    while th.is_alive():
        assert time.monotonic() < deadline, "the viewer never finished"
        t = make_trace(
            step,
            accepted_req_ids=[step],
            accepted_lens=[1 + step % 8],
            num_new_tokens=1 + step % 8,
            schedule_s=step * 1e-4,
        )
        sent[step] = t
        pub.on_step(t)
        step += 1
        time.sleep(0.001)
    return sent


def write_jsonl(path, traces) -> None:
    with open(path, "wb") as f:
        for t in traces:
            f.write(msgspec.json.encode(tap.trace_to_dict(t)) + b"\n")


def test_records_count_traces_from_a_live_publisher_to_jsonl(tmp_path):
    """--jsonl FILE --count N must write exactly N consecutive traces, each equal to the one
    published, then exit 0."""
    path = tmp_path / "run.jsonl"
    with_pub = TapPublisher("tcp://127.0.0.1:*")
    try:
        th, out, result = run_main_in_thread(
            ["--connect", with_pub.bound_addr, "--jsonl", str(path), "--count", "25", "--interval", "0.05"]
        )
        sent = feed_until_done(with_pub, th)
    finally:
        with_pub.close()
    assert result["rc"] == 0
    got = tap.read_jsonl(str(path))
    assert len(got) == 25
    first = got[0].step_id
    assert [t.step_id for t in got] == list(range(first, first + 25))
    assert all(t == msgspec.structs.replace(sent[t.step_id], dropped_traces=t.dropped_traces) for t in got)
    assert "recorded 25 traces" in out.getvalue()


def test_live_table_is_plain_text_when_stdout_is_not_a_terminal(tmp_path):
    """Redraws must be plain blocks (no cursor escapes) showing rates and phase times."""
    pub = TapPublisher("tcp://127.0.0.1:*")
    try:
        th, out, _ = run_main_in_thread(["--connect", pub.bound_addr, "--count", "150", "--interval", "0.05"])
        feed_until_done(pub, th)
    finally:
        pub.close()
    text = out.getvalue()
    assert "\x1b" not in text
    assert "steps/s" in text and "tokens/s" in text and "mean accepted len" in text
    assert "schedule" in text and "p99" in text


SCRIPTED = [
    make_trace(
        0,
        wall_time=10.0,
        schedule_s=0.001,
        compute_max_s=0.010,
        num_new_tokens=2,
        partitions=[PartitionTrace(prefill_req_ids=[1, 2], prefill_num_tokens=[30, 20], free_blocks=[9, 3])],
    ),
    make_trace(
        1,
        wall_time=10.5,
        schedule_s=0.002,
        compute_max_s=0.020,
        num_new_tokens=9,
        accepted_req_ids=[1, 2],
        accepted_lens=[8, 1],
        accepted_num_drafts=[7, 7],
        partitions=[PartitionTrace(decode_req_ids=[1, 2], decode_num_rows=16, free_blocks=[8, 3])],
    ),
    make_trace(
        2,
        wall_time=11.0,
        schedule_s=0.003,
        compute_max_s=0.030,
        num_new_tokens=4,
        accepted_req_ids=[1, 2],
        accepted_lens=[3, 1],
        accepted_num_drafts=[7, 0],
        preempted_req_ids=[2],
        finished_req_ids=[1],
        finished_reasons=["stop"],
        partitions=[PartitionTrace(decode_req_ids=[1, 2], decode_num_rows=9, free_blocks=[7, 2])],
    ),
    make_trace(
        3,
        wall_time=12.0,
        schedule_s=0.004,
        compute_max_s=0.040,
        num_new_tokens=3,
        accepted_req_ids=[2],
        accepted_lens=[3],
        accepted_num_drafts=[7],
        finished_req_ids=[2],
        finished_reasons=["length"],
        dropped_traces=5,
        partitions=[PartitionTrace(decode_req_ids=[2], decode_num_rows=8, free_blocks=[9, 3])],
    ),
]


def test_replay_summarises_a_recording(tmp_path):
    """--replay must report steps, tokens, rates, every phase's percentiles, the acceptance
    length histogram over verifying requests, and per-partition load."""
    path = tmp_path / "run.jsonl"
    write_jsonl(path, SCRIPTED)
    out = io.StringIO()
    assert tap.main(["--replay", str(path)], out=out) == 0
    text = out.getvalue()
    lines = text.splitlines()
    assert "steps 4" in text and "duration 2.000 s" in text
    assert "tokens 18" in text and "steps/s 1.5" in text and "tokens/s 9.0" in text
    assert "preemptions 1" in text and "{'length': 1, 'stop': 1}" in text
    assert "dropped traces 5" in text
    # schedule 1,2,3,4 ms: mean 2.5, p50 2.5, max 4; compute 10..40 ms: p50 25
    sched = next(ln for ln in lines if ln.startswith("schedule"))
    assert sched.split()[1:] == ["2.500", "2.500", "3.700", "3.970", "4.000"]
    compute = next(ln for ln in lines if ln.startswith("compute_max"))
    assert compute.split()[2] == "25.000"
    for phase in tap.PHASES:
        assert any(ln.startswith(phase[:-2]) for ln in lines), phase
    # verifying requests accepted 8, 1, 3, 3 (the fallback's 1 is not a verify)
    assert "mean 3.750 over 4" in text
    hist = {int(ln.split()[0]): int(ln.split()[1]) for ln in lines if ln[:4].strip().isdigit() and "%" in ln}
    assert hist == {1: 1, 2: 0, 3: 2, 4: 0, 5: 0, 6: 0, 7: 0, 8: 1}
    part = next(ln for ln in lines if ln.split()[:1] == ["0"] and "[" in ln)
    assert part.split()[:3] == ["0", "50", "33"]


def test_replay_of_an_empty_recording_says_so(tmp_path):
    """An empty file must summarise to 'no traces', not crash."""
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    out = io.StringIO()
    assert tap.main(["--replay", str(path)], out=out) == 0
    assert out.getvalue() == "no traces\n"


def test_jsonl_lines_are_objects_that_round_trip_and_tolerate_new_fields():
    """A recorded line must be a JSON object keyed by field name; fields a newer server adds
    must be ignored on replay."""
    t = SCRIPTED[2]
    d = msgspec.json.decode(msgspec.json.encode(tap.trace_to_dict(t)))
    assert d["step_id"] == 2 and d["partitions"][0]["decode_num_rows"] == 9
    assert tap.trace_from_dict(d) == t
    d["a_future_field"] = 1
    d["partitions"][0]["another"] = [1]
    assert tap.trace_from_dict(d) == t


def test_module_runs_from_the_command_line(tmp_path):
    """`python -m tools.tap --replay FILE` must work as a program."""
    path = tmp_path / "run.jsonl"
    write_jsonl(path, SCRIPTED)
    proc = subprocess.run(
        [sys.executable, "-m", "tools.tap", "--replay", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("steps 4")


def test_connect_and_replay_are_exclusive():
    """Exactly one source must be given."""
    with pytest.raises(SystemExit):
        tap.main(["--connect", "5599", "--replay", "x"])


def test_replay_reports_verify_windows_rows_and_drafter_skips(tmp_path):
    """Adaptive verification's figures must survive a recording: verifies, drafts verified
    and the mean window, verify rows per step, and skipped drafter passes."""
    traces = [
        make_trace(
            0,
            accepted_req_ids=[1, 2, 3],
            accepted_lens=[3, 1, 1],
            accepted_num_drafts=[4, 0, 2],
            partitions=[PartitionTrace(verify_rows=8, num_drafter_skips=1)],
        ),
        make_trace(
            1,
            accepted_req_ids=[1],
            accepted_lens=[8],
            accepted_num_drafts=[7],
            partitions=[PartitionTrace(verify_rows=8, num_drafter_skips=2)],
        ),
    ]
    path = tmp_path / "run.jsonl"
    write_jsonl(path, traces)
    out = io.StringIO()
    assert tap.main(["--replay", str(path)], out=out) == 0
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("verifies"))
    assert line == (
        "verifies 3  drafts verified 13 (mean window 4.33)  verify rows 16 (8.0 per step)  drafter passes skipped 3"
    )
