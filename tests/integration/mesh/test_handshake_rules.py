"""The Hello checks, as pure functions (milliseconds, no processes)."""
import pytest

from dspark_loop.errors import MeshStartError
from dspark_loop.mesh_handshake import hello_problem, min_num_blocks
from dspark_loop.protocol import PROTOCOL_VERSION, Hello, identity


def hello(rank=0, world_size=2, version=PROTOCOL_VERSION, num_blocks=(8, 4), error=""):
    return Hello(version, rank, world_size, 1000 + rank, list(num_blocks), error)


def test_a_well_formed_hello_passes():
    """A Hello from the right socket, version and world must be accepted."""
    assert hello_problem(hello(1), identity(1), 2, {0}) is None


@pytest.mark.parametrize("msg, sender, seen, words", [
    (hello(version=PROTOCOL_VERSION + 1), identity(0), set(), "protocol version"),
    (hello(error="boom"), identity(0), set(), "failed to start: boom"),
    (hello(world_size=4), identity(0), set(), "joined a mesh of 2"),
    (hello(rank=2), identity(2), set(), "joined a mesh of 2"),
    (hello(rank=1), identity(0), set(), "from socket"),
    (hello(rank=1), identity(1), {1}, "twice"),
])
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
