"""RestartBudget: N restarts per sliding window, then no more until the oldest ages out."""

from dspark_loop.mesh.restart_budget import RestartBudget


def test_n_restarts_fit_in_the_window_and_the_next_is_refused():
    """Within one window exactly max_restarts must be allowed; the next must be refused."""
    b = RestartBudget(2, window_s=100)
    assert b.take(0) and b.take(10)
    assert not b.take(20) and b.used == 2
    assert "2 rank-mesh restart(s)" in b.why()


def test_the_window_slides():
    """A restart older than the window must stop counting (a refused try costs nothing)."""
    b = RestartBudget(2, window_s=100)
    assert b.take(0) and b.take(50)
    assert not b.take(99)
    assert b.take(100)  # the one at 0 aged out
    assert not b.take(149) and b.take(150)


def test_zero_means_never_restart():
    """--max-rank-restarts 0 must refuse the first restart."""
    assert not RestartBudget(0).take(0)


def test_available_tells_what_take_would_do_without_spending():
    """available(now) must equal take(now)'s answer and must not spend a restart."""
    b = RestartBudget(1, window_s=100)
    assert b.available(0) and b.available(0) and b.used == 0
    assert b.take(0)
    assert not b.available(50) and b.available(100)
