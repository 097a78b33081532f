"""A mesh restart is visible: a Prometheus counter, a /metrics/json figure, and one trace
on the debug tap."""

from dspark_loop.contract.protocol import TRACE_DECODER, MeshRestart
from dspark_loop.observe.metrics import Metrics
from dspark_loop.observe.tap_publisher import TapPublisher
from tests.unit.observe.test_tap_publisher import subscribe

EVENT = MeshRestart("rank 3 (pid 7) exited with signal SIGKILL", 5.25, 1, 2, 3)


def test_metrics_count_restarts_under_dspark_mesh_restarts_total():
    """Each on_mesh_restart must add one to dspark:mesh_restarts_total (exported from zero)."""
    m = Metrics("m")
    assert 'dspark:mesh_restarts_total{model_name="m"} 0' in m.render_prometheus()
    m.on_mesh_restart(EVENT)
    m.on_mesh_restart(EVENT)
    assert 'dspark:mesh_restarts_total{model_name="m"} 2' in m.render_prometheus()
    assert m.snapshot()["mesh_restarts_total"] == 2


def test_the_tap_publishes_the_restart_as_a_trace():
    """A subscriber must receive one StepTrace (step -1) carrying the MeshRestart and a
    readable line in its errors."""
    pub = TapPublisher("tcp://127.0.0.1:*")
    try:
        sub = subscribe(pub)
        pub.on_mesh_restart(EVENT)
        assert sub.poll(5000)
        trace = TRACE_DECODER.decode(sub.recv())
        sub.close()
    finally:
        pub.close()
    assert trace.step_id == -1 and trace.mesh_restart == EVENT
    assert trace.errors == ["rank mesh restarted in 5.25 s: rank 3 (pid 7) exited with signal SIGKILL"]
