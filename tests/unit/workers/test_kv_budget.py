"""An accelerator's KV budget without --kv-cache-memory (workers/kv_budget.py): its
--gpu-memory-utilization share less what the loaded weights use, or an error naming the
flags when nothing is left."""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import parse_args
from dspark_loop.config.rank_config import rank_config
from workers.kv_budget import budget_from_device

GIB = 1 << 30


def test_the_pools_get_the_share_less_what_the_weights_use():
    """64 GiB, 20 GiB in use after loading, 0.9: 57.6 - 20 = 37.6 GiB for KV pages."""
    assert budget_from_device(free=44 * GIB, total=64 * GIB, utilization=0.9) == int(0.9 * 64 * GIB) - 20 * GIB


def test_weights_over_the_share_is_an_error_naming_the_flags():
    with pytest.raises(ValueError) as e:
        budget_from_device(free=4 * GIB, total=64 * GIB, utilization=0.9)
    message = str(e.value)
    assert "--gpu-memory-utilization 0.9" in message and "60.0 of the device's 64.0 GiB" in message
    assert "--kv-cache-memory" in message and "--num-blocks" in message


@pytest.mark.parametrize("flag", ["--gpu-memory-utilization", "--mem-fraction-static"])
def test_the_share_reaches_every_rank_under_either_name(flag):
    cfg = parse_args(["--backend", "npu", "--dp", "2", "--tp", "2", flag, "0.8"])
    assert cfg.gpu_memory_utilization == 0.8 and rank_config(cfg).gpu_memory_utilization == 0.8


@pytest.mark.parametrize("value", ["0", "1.5", "nan", "x"])
def test_a_share_outside_0_1_exits_2_naming_the_flag(value, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--gpu-memory-utilization", value])
    assert e.value.code == 2 and "argument --gpu-memory-utilization" in capsys.readouterr().err
