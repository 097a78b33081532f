"""The command line for real: --prompt offline mode, and bad flags."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dspark_testing.server_process import REPO


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dspark_loop", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_offline_prompts_print_the_served_completions(tiny_ckpt, server1):
    """--prompt (twice) must print each prompt's greedy completion, the same text the HTTP
    server gives for it, in order, and exit 0."""
    prompts = ["hello world", "The quick brown fox"]
    done = run_cli(
        "--model",
        tiny_ckpt,
        "--prompt",
        prompts[0],
        "--prompt",
        prompts[1],
        "--max-tokens",
        "5",
        "--generate-config",
        '{"ignore_eos": true}',
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = "".join(
        f"--- prompt {i + 1}: {p!r}\n{server1.complete(p, 5)['choices'][0]['text']}\n" for i, p in enumerate(prompts)
    )
    assert done.stdout == expected


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--tp", "0"], "--tp"),
        (["--port", "http"], "--port"),
        (["--dtype", "float8"], "--dtype"),
        (["--speculative-config", "{not json"], "--speculative-config"),
        (["--model", "/nonexistent/dir"], "--model"),
        (["--frobnicate"], "--frobnicate"),
    ],
    ids=["tp-0", "port-word", "dtype", "spec-json", "model-dir", "unknown-flag"],
)
def test_bad_flag_exits_2_naming_the_flag(args, flag):
    """A bad flag must exit 2 before any rank starts, with an error line naming the flag."""
    done = run_cli(*args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "error:" in done.stderr and flag in done.stderr, done.stderr


def test_inconsistent_topology_exits_2_naming_the_flags(tiny_ckpt):
    """--dp 2 --tp 2 --ep 2 (dp*tp != ep) must exit 2 and say which flags disagree."""
    done = run_cli("--model", tiny_ckpt, "--dp", "2", "--tp", "2", "--ep", "2", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--ep" in done.stderr and "--dp" in done.stderr, done.stderr
