"""The served K=7 chain, observed from outside: lossless against K=0, prefix hits at K=7,
the test drafter's controlled acceptance, and the metrics and debug-tap traces agreeing with
what was served."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import msgspec
import pytest
import zmq

from dspark_loop.contract.protocol import TRACE_DECODER
from dspark_testing.prompts import token_prompt
from dspark_testing.scripted_drafter_runner import served_env
from dspark_testing.server_process import ServerProcess, free_port

MAX_TOKENS = 25  # 1 token from prefill + 8 verifies of exactly 3 at error_at=2
ERROR_AT = 2
PROMPT_A = token_prompt(40, seed=901)  # the test drafter knows this one
PROMPT_B = token_prompt(300, seed=902)  # long enough for a K=7 prefix hit (>= 128 + 128)
PROMPT_C = token_prompt(75, seed=903)  # unknown to the test drafter: noise drafts


class TapRecorder:
    """Subscribes to the server's debug tap and keeps every StepTrace it gets."""

    def __init__(self, addr: str):
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 200)
        self.sock.connect(addr)
        self.traces = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame = self.sock.recv()
            except zmq.Again:
                continue
            self.traces.append(TRACE_DECODER.decode(frame))

    def close(self) -> list:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(0)
        return self.traces


def wait_for(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def finishes(traces: list, reason: str) -> int:
    return sum(r == reason for t in traces for r in t.finished_reasons)


def subscribed(server: ServerProcess, stop_token: int) -> TapRecorder:
    """A recorder the server's tap publishes to. A new subscription reaches the publisher
    some time after connect(), and the publisher sees it only on a step: send one-token
    probes (they finish on `stop_token`, reason "stop") until the recorder gets a probe's
    finish."""
    recorder = TapRecorder(server.tap)
    deadline = time.monotonic() + 60
    while not wait_for(lambda: finishes(recorder.traces, "stop") > 0, 1.0):
        assert time.monotonic() < deadline, "the tap never published to the subscriber"
        server.complete(PROMPT_C, 2, stop_token_ids=[stop_token], ignore_eos=False)
    server.wait_idle()
    return recorder


@pytest.fixture(scope="module")
def k0_outputs(solo1) -> dict:
    return {name: solo1(p, MAX_TOKENS) for name, p in (("a", PROMPT_A), ("b", PROMPT_B), ("c", PROMPT_C))}


@pytest.fixture(scope="module")
def k7_server(drafter_ckpt, k0_outputs, tmp_path_factory):
    spec = tmp_path_factory.mktemp("spec") / "drafter.json"
    spec.write_text(json.dumps({"cases": [{"prompt": PROMPT_A, "reference": k0_outputs["a"], "error_at": ERROR_AT}]}))
    tap = f"tcp://127.0.0.1:{free_port()}"
    # the fixed chain: the exact verify counts below hold only where every window is
    # verified in full (adaptive verification measures this CPU's real costs and may skip)
    speculative = {"method": "dspark", "num_speculative_tokens": 7, "enable_adaptive_verification": False}
    server = ServerProcess(
        ["--model", drafter_ckpt, "--debug-tap", tap, "--speculative-config", json.dumps(speculative)],
        env=served_env(str(spec)),
    )
    server.tap = tap
    yield server
    assert server.stop() == 0, server.log()[-4000:]


def test_k7_output_equals_k0_and_prefix_hits_keep_it(k7_server, k0_outputs):
    """K=7 greedy output must equal K=0 token for token, also when the prompt is served from
    the prefix cache (the second identical long prompt)."""
    for name, prompt in (("a", PROMPT_A), ("c", PROMPT_C), ("b", PROMPT_B), ("b", PROMPT_B)):
        out = k7_server.complete(prompt, MAX_TOKENS)
        assert out["choices"][0]["token_ids"] == k0_outputs[name], name
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] >= 128
    assert "DSpark speculation progress:" in k7_server.log()


def test_test_drafter_accepts_exactly_error_position_plus_one(k7_server, k0_outputs):
    """With the true continuation wrong at index m, every verify must accept m+1 tokens;
    the request's own figures (return_stats) must say so: m drafts accepted a verify."""
    before = k7_server.engine_stats()["dspark"]
    out = k7_server.complete(PROMPT_A, MAX_TOKENS, speculation={"return_stats": True})
    after = k7_server.wait_idle()["dspark"]
    assert out["choices"][0]["token_ids"] == k0_outputs["a"]
    verifies = after["num_verify_steps"] - before["num_verify_steps"]
    accepted = after["num_accepted"] - before["num_accepted"]
    assert verifies == (MAX_TOKENS - 1) // (ERROR_AT + 1)
    assert accepted == verifies * (ERROR_AT + 1) == MAX_TOKENS - 1
    assert after["num_matched"] - before["num_matched"] == verifies * ERROR_AT
    assert after["leases_in_use"] == 0
    assert out["speculation"] == {"proposed": 7 * verifies, "accepted": ERROR_AT * verifies, "verify_steps": verifies}


def test_metrics_and_tap_traces_agree_with_the_served_workload(k7_server, k0_outputs):
    """After a known workload the counters must equal the served totals, and the tap's
    traces must be contiguous and add up to the same tokens and acceptance."""
    recorder = subscribed(k7_server, k0_outputs["c"][0])
    m0 = k7_server.metrics_json()
    outs = [k7_server.complete(p, MAX_TOKENS) for p in (PROMPT_A, PROMPT_B)]
    m1 = k7_server.metrics_json()
    k7_server.wait_idle()
    assert wait_for(lambda: finishes(recorder.traces, "length") >= len(outs), 60), "the workload's traces never came"
    traces = recorder.close()
    # the workload's traces: those after the last probe's (a SUB receives in publishing order)
    last_probe = max(i for i, t in enumerate(traces) if "stop" in t.finished_reasons)
    traces = traces[last_probe + 1 :]

    prompt_tokens = sum(o["usage"]["prompt_tokens"] for o in outs)
    completion_tokens = sum(o["usage"]["completion_tokens"] for o in outs)
    assert m1["prompt_tokens_total"] - m0["prompt_tokens_total"] == prompt_tokens
    assert m1["generation_tokens_total"] - m0["generation_tokens_total"] == completion_tokens
    assert (m1["request_success_total"].get("length", 0) - m0["request_success_total"].get("length", 0)) == len(outs)
    hits = m1["prefix_cache_hits_total"] - m0["prefix_cache_hits_total"]
    assert hits == sum(o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in outs)
    # the metrics' DSpark figures (from traces) and the engine's counters agree
    engine = m1["engine"]["dspark"]
    assert m1["spec_decode_num_drafts_total"] == engine["num_verify_steps"]
    assert m1["verify_policy"]["name"] == "FullVerify" and m1["drafter_skips_total"] == 0
    assert m1["spec_decode_num_accepted_tokens_total"] == engine["num_matched"]

    assert traces, "no StepTrace reached the subscriber"
    ids = [t.step_id for t in traces]
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    assert sum(t.num_new_tokens for t in traces) == completion_tokens
    # accepted_lens are chain lengths before the scheduler's truncation (as the seeds count
    # them), so they cover at least every token after each request's first (from prefill)
    assert sum(sum(t.accepted_lens) for t in traces) >= completion_tokens - len(outs)
    verify_lens = [a for t in traces for a, d in zip(t.accepted_lens, t.accepted_num_drafts) if d]
    assert len(verify_lens) == m1["spec_decode_num_drafts_total"] - m0["spec_decode_num_drafts_total"]
    assert sum(verify_lens) == engine["num_accepted"] - m0["engine"]["dspark"]["num_accepted"]
    assert msgspec.json.encode(traces[-1])  # traces are plain data


async def test_32_concurrent_k7_streams_each_equal_k0(k7_server, solo1, http):
    """32 streams at K=7 (mixed prompt lengths, every request speculating beside the others)
    must each stream exactly the K=0 tokens, and the leases must all be free afterwards."""
    from dspark_testing.prompts import mixed_prompts
    from dspark_testing.stream_client import stream_completion

    prompts = mixed_prompts(32, seed=300)
    want = [await asyncio.to_thread(solo1, p, 8) for p in prompts]
    bodies = [{"prompt": p, "max_tokens": 8, "ignore_eos": True, "return_token_ids": True} for p in prompts]
    results = await asyncio.gather(*(stream_completion(http, k7_server.url, b) for b in bodies))
    for i, (r, w) in enumerate(zip(results, want)):
        assert r.errors == [] and r.done and r.token_ids == w, f"prompt {i} ({len(prompts[i])} tokens)"
    stats = await asyncio.to_thread(k7_server.wait_idle)
    assert stats["dspark"]["leases_in_use"] == 0
