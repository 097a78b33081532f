"""Metrics and the tap plugged into the real EngineLoop (fake mesh): the figures must match
what the requests themselves report."""

import asyncio
import threading

import zmq

from dspark_loop.contract.protocol import TRACE_DECODER
from dspark_loop.engine.loop import EngineLoop
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.observe.metrics import Metrics
from dspark_loop.observe.tap_publisher import TapPublisher
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.engine.factories import make_mesh, make_scheduler, prompt_ids
from tests.unit.observe.factories import prom_samples


class Recorder(EngineObserver):
    def __init__(self):
        self.step_ids = []

    def on_step(self, trace):
        self.step_ids.append(trace.step_id)


class Reader(threading.Thread):
    """A viewer that reads the tap until told to stop."""

    def __init__(self, addr: str):
        super().__init__(daemon=True)
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(addr)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.step_ids, self.stop = [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            if self.sock.poll(20):
                self.step_ids.append(TRACE_DECODER.decode(self.sock.recv()).step_id)
        self.sock.close(0)


async def wait_until(cond, timeout_s: float = 10.0) -> None:
    """Polls cond until it holds; AssertionError after timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_engine_run_counts_match_the_requests_outputs():
    """After a batch of requests, token and request counters must equal the outputs' own
    totals, the gauges must read idle, and every trace the tap sent must arrive in order."""
    sched = make_scheduler(num_partitions=2, max_num_seqs=8)
    metrics = Metrics("tiny", num_blocks_total=[32, 16])
    tap = TapPublisher("tcp://127.0.0.1:*")
    reader = Reader(tap.bound_addr)
    reader.start()
    await wait_until(lambda: tap.has_subscribers)
    rec = Recorder()
    loop = EngineLoop(sched, make_mesh(sched), tiny_tokenizer(), [metrics, tap, rec])
    loop.start()
    try:
        reqs = [GenerateRequest(f"r{i}", prompt_ids(i, 6 + i), SamplingParams(max_tokens=3 + i)) for i in range(12)]

        async def collect(g):
            return [o async for o in loop.generate(g)]

        outs = await asyncio.gather(*(collect(g) for g in reqs))
    finally:
        await loop.stop()
        # the reader has drained: every trace the tap sent has arrived
        await wait_until(lambda: len(reader.step_ids) >= tap.num_sent)
        reader.stop.set()
        reader.join(5)
        tap.close()
    s = prom_samples(metrics.render_prometheus())
    assert s[("vllm:generation_tokens_total", ())] == sum(o[-1].num_output_tokens for o in outs)
    assert s[("vllm:prompt_tokens_total", ())] == sum(len(g.prompt_token_ids) for g in reqs)
    reasons = [o[-1].finish_reason for o in outs]
    assert s[("vllm:request_success_total", (("finished_reason", "length"),))] == reasons.count("length")
    assert sum(v for k, v in s.items() if k[0] == "vllm:request_success_total") == len(reqs)
    assert s[("vllm:time_to_first_token_seconds_count", ())] == len(reqs)
    assert s[("vllm:num_requests_running", ())] == 0
    assert s[("vllm:kv_cache_usage_perc", ())] == 0.0
    assert s[("vllm:spec_decode_num_drafts_total", ())] == 0
    # the tap: an in-order subset of the engine's steps, the rest counted as dropped
    assert reader.step_ids == sorted(reader.step_ids)
    assert set(reader.step_ids) <= set(rec.step_ids)
    assert len(reader.step_ids) + tap.num_dropped == len(rec.step_ids)
    assert len(reader.step_ids) > 0
