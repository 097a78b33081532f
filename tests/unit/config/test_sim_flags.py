"""The simulated device's flags: --backend sim, --device-profile, --sim-speed reach the ranks'
RankConfig; bad values exit 2 naming the flag."""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import parse_args
from dspark_loop.config.rank_config import rank_config

BAD = [
    (["--backend", "sim", "--device-profile", "tpu-v9"], "--device-profile"),
    (["--backend", "sim", "--device-profile", "/no/such/profile.toml"], "--device-profile"),
    (["--backend", "sim", "--sim-speed", "0"], "--sim-speed"),
    (["--backend", "sim", "--sim-speed", "inf"], "--sim-speed"),
    (["--device-profile", "gpu-h200"], "--device-profile/--sim-speed"),
]


@pytest.mark.parametrize("argv,flag", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_sim_flag_exits_2_naming_it(argv, flag, capsys):
    """A bad value (or a sim flag without --backend sim) must exit 2 naming the flag."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert f"error: argument {flag}" in capsys.readouterr().err


def test_sim_flags_reach_the_ranks():
    """--device-profile and --sim-speed must arrive in every rank's RankConfig."""
    cfg = parse_args(["--backend", "sim", "--device-profile", "gpu-h200", "--sim-speed", "50"])
    rank = rank_config(cfg)
    assert (rank.backend, rank.device_profile, rank.sim_speed) == ("sim", "gpu-h200", 50.0)
    assert rank_config(parse_args([])).device_profile == "npu-tile"
