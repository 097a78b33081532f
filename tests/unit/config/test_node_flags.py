"""--nnodes / --node-rank / --dist-init-addr / --dist-timeout and DSPARK_MESH_SECRET:
bad values exit 2 naming the flag, and the node rules are checked with the others."""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import load_config, parse_args
from dspark_loop.contract.mesh_auth import SECRET_ENV
from tests.unit.config.models import flash_model, tiny_config_dict, write_checkpoint_stub
from tests.unit.config.test_validate import FLASH_16, problems

BAD_NODE_FLAGS = [
    (["--nnodes", "0"], "--nnodes"),
    (["--node-rank", "-1"], "--node-rank"),
    (["--node-rank", "one"], "--node-rank"),
    (["--dist-init-addr", "10.0.0.1"], "--dist-init-addr"),
    (["--dist-init-addr", "10.0.0.1:65535"], "--dist-init-addr"),
    (["--dist-timeout", "0"], "--dist-timeout"),
    (["--dist-timeout", "soon"], "--dist-timeout"),
]


@pytest.mark.parametrize("argv,flag", BAD_NODE_FLAGS, ids=[" ".join(a) for a, _ in BAD_NODE_FLAGS])
def test_bad_node_flag_exits_2_naming_the_flag(argv, flag, capsys):
    """A bad value must exit with status 2 and an argparse error line naming the flag."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert f"error: argument {flag}" in capsys.readouterr().err


def test_node_flags_default_to_one_host_and_devices_count_per_node():
    """Without node flags the run is one node; with --nnodes 2, --devices defaults to this
    node's ep/2 devices."""
    cfg = parse_args([])
    assert (cfg.nnodes, cfg.node_rank, cfg.dist_init_addr, cfg.dist_timeout_s) == (1, 0, None, 600.0)
    cfg = parse_args(
        [
            "--dp",
            "4",
            "--tp",
            "4",
            "--ep",
            "16",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--dist-init-addr",
            "10.0.0.1:5000",
            "--dist-timeout",
            "30",
        ]
    )
    assert cfg.devices == tuple(range(8)) and cfg.ranks_per_node == 8
    assert (cfg.node_rank, cfg.dist_init_addr, cfg.dist_timeout_s) == (1, "10.0.0.1:5000", 30.0)


def test_the_flash_deployment_on_two_hosts_of_eight_devices_is_valid():
    """dp4/tp4/ep16 over two nodes of 8 devices each must pass."""
    two = dict(nnodes=2, dist_init_addr="10.0.0.1:5000", devices=tuple(range(8)))
    assert problems(flash_model(), **FLASH_16, **two) == []
    assert problems(flash_model(), **FLASH_16, **two, node_rank=1) == []


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(nnodes=3), "--nnodes 3 must divide --ep 16"),
        (dict(nnodes=2, node_rank=2), "--node-rank must be 0..1 with --nnodes 2 (got 2)"),
        (dict(nnodes=2, dist_init_addr=None), "--dist-init-addr HOST:PORT (node 0's address) is required"),
        (dict(nnodes=2, devices=tuple(range(16))), "--devices must list this node's --ep 16 / --nnodes 2 = 8"),
        (dict(nnodes=2, node_rank=1, prompts=("hi",)), "--prompt runs on node 0 only"),
    ],
)
def test_each_node_rule_violated_gives_its_message(fields, message):
    """Each node rule broken alone must be reported with its flag."""
    base = dict(nnodes=2, dist_init_addr="10.0.0.1:5000", devices=tuple(range(8)))
    found = problems(flash_model(), **FLASH_16, **{**base, **fields})
    assert any(message in p for p in found), found


def test_several_nodes_without_the_secret_exit_2_naming_it(tmp_path, monkeypatch, capsys):
    """--nnodes 2 without DSPARK_MESH_SECRET must exit 2 naming the variable; with it the
    configuration loads."""
    path = write_checkpoint_stub(str(tmp_path / "ckpt"), tiny_config_dict(False), ["embed.weight"])
    argv = [
        "--model",
        path,
        "--dp",
        "2",
        "--tp",
        "2",
        "--ep",
        "4",
        "--nnodes",
        "2",
        "--dist-init-addr",
        "127.0.0.1:5000",
    ]
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(SystemExit) as exc:
        load_config(argv)
    assert exc.value.code == 2 and f"{SECRET_ENV} must be set" in capsys.readouterr().err
    monkeypatch.setenv(SECRET_ENV, "s" * 32)
    cfg, _ = load_config(argv)
    assert cfg.nnodes == 2
