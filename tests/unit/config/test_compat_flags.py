"""vLLM's and SGLang's spellings of this server's flags (config/cli_compat.py): the same
configuration as ours, and a parser name that is not DeepSeek's exits 2 naming its flag."""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import parse_args
from tests.unit.config.models import tiny_config_dict, write_checkpoint_stub

OURS = ["--dp", "2", "--tp", "2", "--ep", "4"]


@pytest.mark.parametrize(
    "theirs",
    [
        # vLLM
        ["--data-parallel-size", "2", "--tensor-parallel-size", "2", "--enable-expert-parallel"],
        # SGLang
        ["--dp-size", "2", "--tp-size", "2", "--ep-size", "4"],
    ],
    ids=["vllm", "sglang"],
)
def test_their_topology_flags_give_our_configuration(theirs):
    assert parse_args(theirs) == parse_args(OURS)


def test_the_flags_for_what_this_server_always_does_change_nothing():
    accepted = ["--trust-remote-code", "--enable-auto-tool-choice", "--enable-expert-parallel"]
    parsers = ["--tool-call-parser", "deepseek_v3", "--reasoning-parser", "deepseek-r1"]
    assert parse_args(OURS + accepted + parsers) == parse_args(OURS)


def test_model_path_is_model(tmp_path):
    write_checkpoint_stub(str(tmp_path), tiny_config_dict(), [])
    assert parse_args(["--model-path", str(tmp_path)]) == parse_args(["--model", str(tmp_path)])


@pytest.mark.parametrize("flag", ["--tool-call-parser", "--reasoning-parser"])
def test_a_parser_that_is_not_deepseeks_exits_2_naming_its_flag(flag, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args([flag, "hermes"])
    assert e.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err
