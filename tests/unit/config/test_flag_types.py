"""flag_types: one parser per kind of value, shared by every flag that takes it."""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import parse_args


@pytest.mark.parametrize("flag", ["--num-blocks", "--max-rank-restarts"])
@pytest.mark.parametrize("text", ["+3", "1_000", "-0", "3.0", "0x3"])
def test_integer_flags_take_plain_digits_only(flag, text, capsys):
    """Every integer flag must accept plain decimal digits only (no sign, underscore,
    fraction or base) and name itself in the error, whichever module declares it."""
    with pytest.raises(SystemExit) as e:
        parse_args([flag, text])
    assert e.value.code == 2
    assert f"argument {flag}: must be" in capsys.readouterr().err


def test_the_same_digits_parse_the_same_under_both_modules():
    """--max-rank-restarts (cli_ops) and --max-queued-requests (cli_ops) parse as
    --num-blocks and --max-num-seqs (cli) do."""
    cfg = parse_args(["--num-blocks", " 3 ", "--max-rank-restarts", " 3 ", "--max-queued-requests", "4"])
    assert (cfg.num_blocks, cfg.max_rank_restarts, cfg.max_queued_requests) == (3, 3, 4)
