"""The seeds' runtime sizing (--ring-heap, --weight-bank-size) reaches each rank's backend,
and a torch backend, which sizes nothing itself, says so once."""

from __future__ import annotations

import logging

import pytest

from dspark_loop.contract.protocol import DEFAULT_RING_HEAP, RankConfig
from workers.backend import Backend


@pytest.mark.parametrize("name", ["cpu", "npu", "cuda"])
def test_a_torch_backend_says_once_that_it_does_not_use_the_runtime_sizing(name, caplog):
    """One line naming both flags and their values from the speaking rank; none from a quiet one."""
    caplog.set_level(logging.INFO, logger="workers.backend")
    Backend(name).size_runtime((1, 2, 3, 4), 6)
    Backend(name).size_runtime((1, 2, 3, 4), 6, quiet=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "workers.backend"]
    assert len(lines) == 1
    assert f"the {name} backend" in lines[0] and "--ring-heap 1,2,3,4" in lines[0]
    assert "--weight-bank-size 6" in lines[0] and "not used" in lines[0]


def test_the_rank_config_carries_the_sizing_across_the_command_line():
    """RankConfig's appended fields must survive the JSON a rank is started with, and default
    to the seeds' ring heap and all layers."""
    rc = RankConfig(model="/ckpt", ring_heap=(8, 8, 16, 32), weight_bank_size=43)
    back = RankConfig.decode(rc.encode())
    assert (back.ring_heap, back.weight_bank_size) == ((8, 8, 16, 32), 43)
    plain = RankConfig.decode('{"model": "/ckpt"}')
    assert (plain.ring_heap, plain.weight_bank_size) == (DEFAULT_RING_HEAP, None)
