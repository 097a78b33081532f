"""The environment a rank process starts with (mesh_procs.rank_env)."""

from dspark_loop.mesh.procs import rank_env


def test_a_rank_gets_its_thread_share_and_sleeping_openmp_waits():
    """A rank must start with OMP_NUM_THREADS = its share of the cores and OpenMP threads
    that sleep at barriers (spinning ones stall a CPU rank whose core is shared)."""
    env = rank_env({"PATH": "/bin"}, 2)
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}


def test_what_the_user_set_wins():
    """A user's OpenMP settings must reach the rank unchanged (and the caller's dict too)."""
    base = {"OMP_NUM_THREADS": "7", "OMP_WAIT_POLICY": "ACTIVE"}
    assert rank_env(base, 2) == base and base == {"OMP_NUM_THREADS": "7", "OMP_WAIT_POLICY": "ACTIVE"}
