"""RankConfig: the one value every rank is started with, built once from ServerConfig."""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import parse_args
from dspark_loop.config.rank_config import rank_config
from dspark_loop.contract.protocol import DEFAULT_RUNNER, RankConfig
from workers.__main__ import parse_args as parse_rank_args


def test_rank_config_copies_every_field_the_server_config_names_alike(tmp_path):
    """Every RankConfig field named like a ServerConfig attribute must carry its value, so
    a new rank option needs no wiring beyond its field."""
    (tmp_path / "config.json").write_text("{}")
    cfg = parse_args(
        [
            "--model",
            str(tmp_path),
            "--dtype",
            "bfloat16",
            "--block-size",
            "64",
            "--max-model-len",
            "777",
            "--num-blocks",
            "12",
            "--log-level",
            "debug",
        ]
    )
    rc = rank_config(cfg)
    for name in RankConfig.__struct_fields__:
        if hasattr(cfg, name) and name != "devices":
            assert getattr(rc, name) == getattr(cfg, name), name
    assert (rc.model, rc.dtype, rc.block_size, rc.max_model_len) == (str(tmp_path), "bfloat16", 64, 777)


def test_rank_config_derives_the_drafter_leases_only_at_k7():
    """K=7 must give one lease per request slot of a TP group; K=0 none."""
    k0 = rank_config(parse_args(["--dp", "2", "--tp", "1", "--max-num-seqs", "8"]))
    k7 = rank_config(
        parse_args(
            ["--dp", "2", "--tp", "1", "--max-num-seqs", "8", "--speculative-config", '{"num_speculative_tokens": 7}']
        )
    )
    assert (k0.spec_k, k0.num_leases) == (0, 0)
    assert (k7.spec_k, k7.num_leases, k7.world_size, k7.devices) == (7, 4, 2, [0, 1])


def test_rank_config_survives_the_command_line_round_trip():
    """The encoded value must decode to an equal RankConfig, and a rank must accept it."""
    rc = RankConfig(
        model="/ckpt",
        world_size=4,
        tp=2,
        num_blocks=[3, 4],
        spec_k=7,
        num_leases=2,
        connect="tcp://127.0.0.1:1",
        dist_init="tcp://127.0.0.1:2",
    )
    assert RankConfig.decode(rc.encode()) == rc
    assert parse_rank_args(["--rank", "3", "--config", rc.encode()]) == (3, rc)
    assert rc.runner == DEFAULT_RUNNER and rc.device_id(3) == 0


@pytest.mark.parametrize(
    "config, needle",
    [
        ('{"model": "/m", "world_size": 4, "tp": 3, "connect": "a", "dist_init": "b"}', "not a topology"),
        ('{"model": "/m", "spec_k": 3, "connect": "a", "dist_init": "b"}', "spec_k must be 0 or 7"),
        ('{"model": "/m", "tpp": 2}', "unknown field"),
        ('{"model": "/m"}', "connect and dist_init"),
        ("not json", "JSON"),
    ],
)
def test_a_rank_refuses_a_bad_config_naming_the_flag(config, needle, capsys):
    """A rank given a config it cannot run must exit 2 with a message naming --config."""
    with pytest.raises(SystemExit) as e:
        parse_rank_args(["--rank", "0", "--config", config])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--config" in err and needle in err


def test_a_node_indexes_its_devices_from_its_first_rank():
    """On a node running ranks 8..15, --devices lists that node's devices: rank 9 must get the
    second one (or device 1 when none are listed); on cpu every rank uses device 0."""
    rc = RankConfig(model="/m", world_size=16, tp=4, backend="npu", devices=[4, 5, 6, 7, 0, 1, 2, 3], first_rank=8)
    assert rc.device_id(9) == 5 and rc.device_id(15) == 3
    assert RankConfig(model="/m", world_size=16, backend="npu", first_rank=8).device_id(9) == 1
    assert RankConfig(model="/m", world_size=16, first_rank=8).device_id(9) == 0


def test_cpu_threads_are_shared_among_this_nodes_ranks_only(monkeypatch):
    """A CPU rank's torch threads must be the host's cores over the ranks on this host, not
    over the whole world."""
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    one = rank_config(parse_args(["--dp", "2", "--tp", "2", "--ep", "4"]))
    two = rank_config(
        parse_args(["--dp", "2", "--tp", "2", "--ep", "4", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:5000"])
    )
    assert (one.threads, two.threads) == (4, 8)
