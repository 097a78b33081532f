"""The operator's flags: defaults, values, and bad values exiting 2 naming the flag."""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import parse_args

BAD = [
    (["--max-queued-requests", "0"], "--max-queued-requests"),
    (["--max-queued-requests", "many"], "--max-queued-requests"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
    (["--shutdown-timeout", "nan"], "--shutdown-timeout"),
    (["--stream-write-timeout", "inf"], "--stream-write-timeout"),
]


@pytest.mark.parametrize("argv,flag", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_operator_flag_exits_2_naming_it(argv, flag, capsys):
    """A bad value must exit 2 with argparse's error line naming the flag."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert f"error: argument {flag}" in capsys.readouterr().err


def test_operator_defaults_and_values(monkeypatch):
    """Defaults: no keys, no queue limit, a 30 s drain, a 30 s stalled-write limit; the
    flags set them, --api-key repeats and merges with DSPARK_API_KEY without duplicates."""
    monkeypatch.delenv("DSPARK_API_KEY", raising=False)
    cfg = parse_args([])
    assert (cfg.api_keys, cfg.max_queued_requests) == ((), None)
    assert (cfg.shutdown_timeout_s, cfg.stream_write_timeout_s) == (30.0, 30.0)
    monkeypatch.setenv("DSPARK_API_KEY", "k2,k3")
    cfg = parse_args(
        [
            "--api-key",
            "k1",
            "--api-key",
            "k2",
            "--max-queued-requests",
            "7",
            "--shutdown-timeout",
            "2.5",
            "--stream-write-timeout",
            "0",
        ]
    )
    assert cfg.api_keys == ("k1", "k2", "k3") and cfg.max_queued_requests == 7
    assert (cfg.shutdown_timeout_s, cfg.stream_write_timeout_s) == (2.5, 0.0)
