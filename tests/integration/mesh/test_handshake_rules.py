"""The Hello checks, as pure functions (milliseconds, no processes)."""

import msgspec
import pytest

from dspark_loop.contract.errors import MeshStartError
from dspark_loop.contract.protocol import PROTOCOL_VERSION, Hello, NodeHello, RankConfig, Refused, Welcome, identity
from dspark_loop.mesh.handshake import RollCall, hello_problem, min_num_blocks, node_problem
from dspark_loop.mesh.nodes import NodeLayout


def hello(rank=0, world_size=2, version=PROTOCOL_VERSION, num_blocks=(8, 4), error=""):
    return Hello(version, rank, world_size, 1000 + rank, list(num_blocks), error)


def test_a_well_formed_hello_passes():
    """A Hello from the right socket, version and world must be accepted."""
    assert hello_problem(hello(1), identity(1), 2, {0}) is None


@pytest.mark.parametrize(
    "msg, sender, seen, words",
    [
        (hello(version=PROTOCOL_VERSION + 1), identity(0), set(), "protocol version"),
        (hello(error="boom"), identity(0), set(), "failed to start: boom"),
        (hello(world_size=4), identity(0), set(), "joined a mesh of 2"),
        (hello(rank=2), identity(2), set(), "joined a mesh of 2"),
        (hello(rank=1), identity(0), set(), "from socket"),
        (hello(rank=1), identity(1), {1}, "twice"),
    ],
)
def test_a_bad_hello_is_refused_with_a_reason(msg, sender, seen, words):
    """Wrong version, a start error, another world, a spoofed socket or a repeat must each
    stop the start-up with a message that says which."""
    assert words in hello_problem(msg, sender, 2, seen)


def test_num_blocks_is_the_per_family_minimum_over_ranks():
    """Every rank of a partition holds a replica, so the pool is the smallest rank's."""
    assert min_num_blocks([hello(0, num_blocks=(8, 5)), hello(1, num_blocks=(6, 9))]) == [6, 5]


def test_ranks_disagreeing_on_cache_families_fail_start():
    """Ranks that built different cache layouts must not be served."""
    with pytest.raises(MeshStartError, match="cache families"):
        min_num_blocks([hello(0, num_blocks=(8, 5)), hello(1, num_blocks=(8,))])


NODES = NodeLayout(nnodes=2, world_size=4)
RANK_CFG = RankConfig(model="/ckpt", world_size=4, tp=2, max_model_len=1024)
FP = "f" * 64


def node_hello(node=1, nnodes=2, version=PROTOCOL_VERSION, fingerprint=FP, **cfg):
    theirs = msgspec.structs.replace(RANK_CFG, **cfg)
    return NodeHello(version, node, nnodes, fingerprint, theirs.encode())


def test_a_rank_serving_another_checkpoint_is_refused():
    """A Hello whose fingerprint differs from node 0's must be refused, naming both."""
    msg = msgspec.structs.replace(hello(1), fingerprint="a" * 64)
    assert "serves another checkpoint (fingerprint aaaaaaaaaaaa) than node 0 (ffffffffffff)" in hello_problem(
        msg, identity(1), 2, set(), FP
    )


def test_a_node_with_node_local_differences_joins():
    """Another checkpoint path, other devices, threads, pool size or log level on node 1 must
    not stop it joining."""
    msg = node_hello(
        model="/other/path",
        devices=[4, 5],
        threads=3,
        kv_cache_memory=1 << 20,
        log_level="debug",
        first_rank=2,
        parent_pid=77,
    )
    assert node_problem(msg, b"node1", NODES, RANK_CFG, FP, set()) is None


@pytest.mark.parametrize(
    "msg, sender, joined, words",
    [
        (node_hello(version=PROTOCOL_VERSION + 1), b"node1", set(), "protocol version"),
        (node_hello(nnodes=3), b"node1", set(), "--nnodes 3 --node-rank 1, node 0 with --nnodes 2"),
        (node_hello(node=2), b"node2", set(), "--node-rank 2"),
        (node_hello(), b"node2", set(), "from socket"),
        (node_hello(), b"node1", {1}, "already in the mesh"),
        (node_hello(fingerprint="b" * 64), b"node1", set(), "serves another checkpoint"),
        (node_hello(max_model_len=512), b"node1", set(), "max_model_len 512 (node 0: 1024)"),
        (node_hello(tp=4, dtype="bfloat16"), b"node1", set(), "tp 4 (node 0: 2), dtype 'bfloat16'"),
    ],
)
def test_a_node_that_cannot_join_is_refused_with_a_reason(msg, sender, joined, words):
    """Another protocol, node count, a node rank out of range, a spoofed socket, a second
    node 1, another checkpoint or other run-shaping flags must each be refused, saying which."""
    assert words in node_problem(msg, sender, NODES, RANK_CFG, FP, joined)


def test_roll_call_welcomes_once_and_remembers_the_last_refusal():
    """RollCall must answer Refused (kept for the timeout message) or Welcome, clear the
    refusal once the node joins, and refuse a second agent for the same node."""
    roll = RollCall(NODES, RANK_CFG, FP)
    assert isinstance(roll.node_hello(b"node1", node_hello(max_model_len=512)), Refused)
    assert 1 in roll.refusals
    assert roll.node_hello(b"node1", node_hello()) == Welcome(1)
    assert roll.joined == {1} and roll.refusals == {}
    assert isinstance(roll.node_hello(b"node1", node_hello()), Refused)
    for rank in range(3):
        roll.hello(identity(rank), msgspec.structs.replace(hello(rank, world_size=4), fingerprint=FP))
    assert not roll.complete
    with pytest.raises(MeshStartError, match=r"failed to start: boom \(rank 3 is on node 1\)"):
        roll.hello(identity(3), hello(3, world_size=4, error="boom"))
