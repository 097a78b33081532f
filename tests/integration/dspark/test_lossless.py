"""K=7 greedy output must equal K=0 output token for token (the first rule of DSpark), for a
table of request shapes run concurrently through the real engine and ranks' runner."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import SamplingParams
from dspark_testing.scripted_drafter import ScriptedDrafter
from tests.integration.dspark.harness import prompt, run

VOCAB = 1024
MAX_MODEL_LEN = 72


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(
        str(tmp_path_factory.mktemp("dspark") / "tiny"),
        size="tiny",
        seed=5,
        with_drafter=True,
        num_hidden_layers=4,
        quiet=True,
    )


def table(ref_tokens=None, tokenizer=None):
    """request id -> (prompt, params). With a K=0 reference, the stop cases stop mid-output."""
    prompts = {
        "short": prompt(1, 5, VOCAB),
        "chunked": prompt(2, 45, VOCAB),
        "ceiling": prompt(3, 50, VOCAB),
        "stop_id": prompt(4, 12, VOCAB),
        "stop_str": prompt(5, 9, VOCAB),
        "plain": prompt(6, 20, VOCAB),
    }
    params = {k: SamplingParams(max_tokens=20, ignore_eos=True) for k in prompts}
    params["ceiling"] = SamplingParams(max_tokens=100, ignore_eos=True)  # ends at max_model_len
    if ref_tokens is not None:
        # NOTE: stop on a token / text the K=0 run emits mid-way, so the stop lands inside
        # a K=7 chain (the host must cut the accepted list there).
        params["stop_id"] = SamplingParams(max_tokens=20, stop_token_ids=[ref_tokens["stop_id"][9]])
        text = tokenizer.decode(ref_tokens["stop_str"][:12])
        params["stop_str"] = SamplingParams(max_tokens=20, stop=[text[-3:]] if len(text) >= 3 else [])
    return prompts, params


class Traces(EngineObserver):
    def __init__(self):
        self.steps = []

    def on_step(self, trace):
        self.steps.append(trace)


@pytest.fixture(scope="module")
def reference(ckpt):
    prompts, params = table()
    first = run(ckpt, 0, prompts, params, max_model_len=MAX_MODEL_LEN, long_prefill_token_threshold=16)
    tok = Tokenizer.from_file(f"{ckpt}/tokenizer.json")
    prompts, params = table(first.tokens, tok)
    ref = run(ckpt, 0, prompts, params, max_model_len=MAX_MODEL_LEN, long_prefill_token_threshold=16)
    return prompts, params, ref


def test_k7_with_the_real_drafter_equals_k0_for_every_request_shape(ckpt, reference):
    """Short, multi-chunk, ceiling-bound, stop-id and stop-string requests run together must
    produce the K=0 tokens and finish reasons; the ceiling request must fall back to 1 row."""
    prompts, params, ref = reference
    got = run(ckpt, 7, prompts, params, max_model_len=MAX_MODEL_LEN, long_prefill_token_threshold=16)
    assert got.tokens == ref.tokens
    assert got.reasons == ref.reasons
    assert got.texts == ref.texts
    assert ref.reasons["stop_id"] == "stop" and len(ref.tokens["stop_id"]) <= 10
    assert ref.reasons["ceiling"] == "length" and len(ref.tokens["ceiling"]) == MAX_MODEL_LEN - 50
    s = got.summary
    assert s["num_verify_steps"] > 0 and s["num_fallback_steps"] > 0
    assert s["num_proposed"] == 7 * s["num_verify_steps"]
    assert s["leases_in_use"] == 0


def test_k0_with_async_scheduling_equals_lockstep_for_every_request_shape(ckpt, reference):
    """Planning each step while the previous one runs (placeholder inputs resolved by the
    ranks, wasted rows of requests that stopped) must give the lockstep tokens, finish
    reasons and texts for every request shape, over 2 partitions too."""
    prompts, params, ref = reference
    for dp in (1, 2):
        got = run(
            ckpt,
            0,
            prompts,
            params,
            max_model_len=MAX_MODEL_LEN,
            long_prefill_token_threshold=16,
            dp=dp,
            async_scheduling=True,
        )
        assert (got.tokens, got.reasons, got.texts) == (ref.tokens, ref.reasons, ref.texts), dp


@pytest.mark.parametrize("error_at", [0, 2, 7])
def test_test_drafter_accepts_exactly_error_at_plus_one_and_stays_lossless(ckpt, reference, error_at):
    """A drafter wrong exactly at draft m must make every verify that does not end its
    request accept m+1 tokens; rejected rows (eager publish) heal, output equals K=0, and
    the counters add up."""
    prompts, params, ref = reference
    spec = {"cases": [{"prompt": prompts[k], "reference": ref.tokens[k], "error_at": error_at} for k in prompts]}
    traces = Traces()
    got = run(
        ckpt,
        7,
        prompts,
        params,
        max_model_len=MAX_MODEL_LEN,
        long_prefill_token_threshold=16,
        test_drafter=lambda: ScriptedDrafter(spec, VOCAB, 7),
        observers=[traces],
    )
    assert got.tokens == ref.tokens
    assert got.reasons == ref.reasons
    verify_lens = []
    for t in traces.steps:
        for rid, a, nd in zip(t.accepted_req_ids, t.accepted_lens, t.accepted_num_drafts):
            if nd:
                verify_lens.append(a)
                if rid not in t.finished_req_ids:
                    assert a == error_at + 1
    s = got.summary
    assert s["num_verify_steps"] == len(verify_lens) > 0
    assert s["num_accepted"] == sum(verify_lens)
    assert s["num_matched"] == s["num_accepted"] - s["num_verify_steps"]
    assert s["num_proposed"] == 7 * s["num_verify_steps"]
    assert s["leases_in_use"] == 0
