"""TapPublisher against real ZMQ SUB sockets on loopback."""

import threading
import time

import msgspec
import pytest
import zmq

from dspark_loop.contract.protocol import TRACE_DECODER, PartitionTrace
from dspark_loop.observe.tap_publisher import TapPublisher, tap_address
from tests.unit.observe.factories import make_trace

THREAD_LIMIT_S = 30.0  # far above any healthy run; a blocked send would never return


@pytest.fixture
def publisher():
    pub = TapPublisher("tcp://127.0.0.1:*")
    yield pub
    pub.close()


def subscribe(pub: TapPublisher, **opts) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    for opt, value in opts.items():
        sock.setsockopt(getattr(zmq, opt), value)
    sock.connect(pub.bound_addr)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    deadline = time.monotonic() + 5
    while not pub.has_subscribers:
        assert time.monotonic() < deadline, "subscription never reached the publisher"
        time.sleep(0.005)
    return sock


def publish_in_thread(pub: TapPublisher, traces) -> None:
    errors = []

    def run():
        try:
            for t in traces:
                pub.on_step(t)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(THREAD_LIMIT_S)
    assert not th.is_alive(), "publishing blocked"
    assert errors == []


def big_traces(n: int):
    part = PartitionTrace(decode_req_ids=list(range(2000)), free_blocks=[100, 50])  # ~6 KB
    return (make_trace(i, partitions=[part]) for i in range(n))


def test_subscriber_receives_every_trace_in_order_and_they_decode(publisher):
    """Traces published while a subscriber keeps up must all arrive, in step order, equal to
    what the engine produced."""
    sub = subscribe(publisher)
    sent = [make_trace(i, accepted_req_ids=[i], accepted_lens=[1 + i % 8], num_new_tokens=i) for i in range(200)]
    got = []
    for t in sent:  # an engine step takes milliseconds: the viewer reads between steps
        publisher.on_step(t)
        if sub.poll(5000):
            got.append(TRACE_DECODER.decode(sub.recv()))
    sub.close()
    assert got == sent
    assert publisher.num_sent == 200 and publisher.num_dropped == 0


def test_a_burst_within_the_queue_limit_arrives_whole(publisher):
    """Up to SNDHWM traces published back to back must all be delivered."""
    sub = subscribe(publisher)
    for i in range(publisher.sndhwm):
        publisher.on_step(make_trace(i))
    got = []
    while len(got) < publisher.sndhwm and sub.poll(5000):
        got.append(TRACE_DECODER.decode(sub.recv()).step_id)
    sub.close()
    assert got == list(range(publisher.sndhwm))


def test_publishing_with_no_subscriber_skips_without_blocking(publisher):
    """With nobody listening, 10k traces must return promptly, raise nothing, and count as
    skipped (never encoded, never queued)."""
    publish_in_thread(publisher, big_traces(10_000))
    assert publisher.num_skipped == 10_000
    assert publisher.num_sent == 0


def test_stalled_subscriber_makes_the_tap_drop_and_count_not_block(publisher):
    """A subscriber that stops reading must never stall the engine: sends past the queue
    limit are dropped and counted, and later traces report the count."""
    sub = subscribe(publisher, RCVHWM=1, RCVBUF=4096)
    publish_in_thread(publisher, big_traces(10_000))
    assert publisher.num_sent + publisher.num_dropped == 10_000
    assert publisher.num_dropped > 0
    # the viewer wakes up: drain it, then the next delivered trace carries the drop count
    dropped = publisher.num_dropped
    deadline = time.monotonic() + 10
    last = None
    while time.monotonic() < deadline:
        while sub.poll(10):
            last = TRACE_DECODER.decode(sub.recv())
        if last is not None and last.step_id == 99_999:
            break
        publisher.on_step(make_trace(99_999))
    sub.close()
    assert last is not None and last.step_id == 99_999
    assert last.dropped_traces >= dropped


def test_the_engines_trace_is_not_modified(publisher):
    """Other observers share the trace object; stamping the drop count must touch a copy."""
    sub = subscribe(publisher)
    publisher.num_dropped = 7
    trace = make_trace(1)
    publisher.on_step(trace)
    assert trace.dropped_traces == 0
    assert sub.poll(5000)
    assert TRACE_DECODER.decode(sub.recv()).dropped_traces == 7
    sub.close()


def test_a_disconnected_subscriber_stops_the_encoding(publisher):
    """When the last viewer leaves, traces must be skipped again."""
    sub = subscribe(publisher)
    sub.close()
    deadline = time.monotonic() + 5
    while publisher.has_subscribers:
        assert time.monotonic() < deadline, "unsubscription never reached the publisher"
        time.sleep(0.005)
    publisher.on_step(make_trace(1))
    assert publisher.num_skipped == 1


def test_closed_publisher_ignores_traces():
    """After close() the engine may still call on_step; it must be a no-op."""
    pub = TapPublisher("tcp://127.0.0.1:*")
    pub.close()
    pub.on_step(make_trace(1))
    pub.close()
    assert (pub.num_sent, pub.num_dropped, pub.num_skipped) == (0, 0, 0)


def test_taken_address_fails_at_startup(publisher):
    """Binding an address already in use must raise, not publish nowhere."""
    with pytest.raises(zmq.ZMQError):
        TapPublisher(publisher.bound_addr)


@pytest.mark.parametrize(
    "given, bound",
    [
        ("5599", "tcp://127.0.0.1:5599"),
        (":5599", "tcp://127.0.0.1:5599"),
        ("0.0.0.0:5599", "tcp://0.0.0.0:5599"),
        ("tcp://*:5599", "tcp://*:5599"),
        ("ipc:///tmp/tap.sock", "ipc:///tmp/tap.sock"),
    ],
)
def test_tap_address_binds_loopback_unless_told_otherwise(given, bound):
    """A bare port must mean loopback; an address that names a host or scheme is kept."""
    assert tap_address(given) == bound


@pytest.mark.parametrize("given", ["localhost", "tcp://host", "http://x:1", ""])
def test_tap_address_refuses_what_is_not_an_address(given):
    """Anything that is not a port, host:port or ZeroMQ address must raise ValueError."""
    with pytest.raises(ValueError, match="must be a port"):
        tap_address(given)


def test_trace_encoding_is_the_wire_encoder():
    """The tap must speak the protocol's msgpack StepTrace (TRACE_DECODER reads it)."""
    t = make_trace(3, errors=["x"], accepted_num_drafts=[7])
    assert TRACE_DECODER.decode(msgspec.msgpack.encode(t)) == t
