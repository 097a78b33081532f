"""Node layout: which ranks a node runs, where node 0 listens, and the start-up timeout text."""

from __future__ import annotations

import pytest

from dspark_loop.mesh.nodes import NodeLayout, mesh_endpoints, missing_message, parse_host_port

COMMAND = "python -m dspark_loop --nnodes 2 --node-rank {node} --dist-init-addr 10.0.0.1:5000"


def test_each_node_runs_a_consecutive_block_of_ranks():
    """16 ranks on 2 nodes must be 0..7 on node 0 and 8..15 on node 1, and node_of must
    invert ranks_of."""
    layout = NodeLayout(nnodes=2, node_rank=1, world_size=16)
    assert layout.ranks_of(0) == range(0, 8) and layout.local_ranks == range(8, 16)
    assert [layout.node_of(r) for r in range(16)] == [0] * 8 + [1] * 8
    assert list(layout.remote_nodes) == [1]
    assert list(NodeLayout(world_size=4).remote_nodes) == []


def test_dist_init_addr_gives_the_rendezvous_and_the_next_port_for_the_mesh():
    """HOST:PORT must give torch.distributed HOST:PORT and the ROUTER HOST:PORT+1."""
    assert parse_host_port("10.0.0.1:5000") == ("10.0.0.1", 5000)
    assert parse_host_port("node0.cluster:29500") == ("node0.cluster", 29500)
    assert mesh_endpoints("10.0.0.1", 5000) == ("tcp://10.0.0.1:5000", "tcp://10.0.0.1:5001")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("10.0.0.1", "HOST:PORT"),
        (":5000", "HOST:PORT"),
        ("h:port", "HOST:PORT"),
        ("h:65535", "next port"),
        ("h:0", "port must be"),
        ("[::1]:5000", "IPv4"),
    ],
)
def test_bad_dist_init_addr_is_refused_with_the_reason(text, problem):
    """A malformed address must raise ValueError saying what is wrong."""
    with pytest.raises(ValueError, match=problem):
        parse_host_port(text)


def test_timeout_message_names_the_node_that_never_joined_and_how_to_start_it():
    """A node whose agent never joined must be named with its ranks and its start command;
    a node that joined but whose ranks are silent must be told apart; the last refusal of a
    node is quoted."""
    layout = NodeLayout(nnodes=3, world_size=6)
    text = missing_message(
        layout,
        said_hello={0, 1, 2},
        joined={1},
        timeout_s=30,
        node_command=COMMAND,
        refusals={2: "wrong DSPARK_MESH_SECRET"},
    )
    assert text.startswith("within 30 s: ")
    assert "node 1 joined but its ranks 3 did not say Hello" in text
    assert (
        "node 2 (ranks 4, 5) never joined (last attempt refused: wrong DSPARK_MESH_SECRET): "
        "start `python -m dspark_loop --nnodes 2 --node-rank 2 --dist-init-addr "
        "10.0.0.1:5000` there"
    ) in text
    assert "node 0" not in text


def test_timeout_message_on_one_host_keeps_the_rank_list():
    """Without nodes the message must list the silent ranks as before."""
    text = missing_message(NodeLayout(world_size=2), set(), set(), 0.5, COMMAND, {})
    assert text.startswith("ranks [0, 1] did not say Hello within 0 s")
