"""Seeded sampling through the real engine and ranks' runner on a tiny checkpoint: a seed's
tokens must not depend on the batch or on speculation (K=7 == K=0), with top-p, top-k,
min-p and penalties on; logprobs must be transformers' log_softmax of the same logits."""

from __future__ import annotations

import pytest
import torch

from dspark_loop.contract.sampling_knobs import SamplingKnobs
from dspark_loop.engine.observer import EngineObserver
from dspark_loop.engine.outputs import SamplingParams
from dspark_testing.scripted_drafter import ScriptedDrafter
from dspark_testing.tie_rule import lowest_index_ties
from tests.integration.dspark.harness import prompt, run

VOCAB = 1024
MAX_MODEL_LEN = 96
SAMPLED = dict(
    knobs=SamplingKnobs(
        temperature=0.8,
        top_p=0.9,
        top_k=40,
        min_p=0.02,
        presence_penalty=0.4,
        frequency_penalty=0.3,
        repetition_penalty=1.15,
    ),
    ignore_eos=True,
)


class Traces(EngineObserver):
    def __init__(self):
        self.steps = []

    def on_step(self, trace):
        self.steps.append(trace)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(
        str(tmp_path_factory.mktemp("sampling") / "tiny"),
        size="tiny",
        seed=5,
        with_drafter=True,
        num_hidden_layers=4,
        quiet=True,
    )


def requests(n_others: int):
    """'probe' plus n_others other requests (other prompts, seeds, settings)."""
    prompts = {"probe": prompt(1, 21, VOCAB)}
    params = {"probe": SamplingParams(max_tokens=24, seed=1234, **SAMPLED)}
    for i in range(n_others):
        prompts[f"o{i}"] = prompt(100 + i, 5 + 3 * i % 40, VOCAB)
        params[f"o{i}"] = SamplingParams(
            max_tokens=12 + i % 9,
            seed=i,
            knobs=SamplingKnobs(temperature=0.3 + (i % 5) * 0.3, top_p=1.0 if i % 2 else 0.8),
            ignore_eos=True,
        )
    return prompts, params


@pytest.fixture(scope="module")
def alone(ckpt):
    prompts, params = requests(0)
    return run(ckpt, 0, prompts, params, max_model_len=MAX_MODEL_LEN).tokens["probe"]


def test_a_seeded_request_samples_the_same_tokens_alone_and_beside_31_others(ckpt, alone):
    """The probe's tokens must be identical alone and among 31 concurrent requests (chunked
    prefill, mixed settings), and really sampled (not the greedy output)."""
    prompts, params = requests(31)
    crowd = run(ckpt, 0, prompts, params, max_model_len=MAX_MODEL_LEN, max_num_seqs=32, long_prefill_token_threshold=16)
    assert crowd.tokens["probe"] == alone
    greedy = run(
        ckpt,
        0,
        {"probe": prompts["probe"]},
        {"probe": SamplingParams(max_tokens=24, ignore_eos=True)},
        max_model_len=MAX_MODEL_LEN,
    ).tokens["probe"]
    assert greedy != alone
    other_seed = SamplingParams(max_tokens=24, seed=4321, **SAMPLED)
    assert (
        run(ckpt, 0, {"probe": prompts["probe"]}, {"probe": other_seed}, max_model_len=MAX_MODEL_LEN).tokens["probe"]
        != alone
    )


def test_a_seeded_request_among_31_others_with_async_scheduling_samples_the_alone_tokens(ckpt, alone):
    """With async scheduling (the ranks resolve each sampled request's next input from
    their own last sample) the probe among 31 sampled, penalised requests must sample
    exactly its lockstep tokens alone."""
    prompts, params = requests(31)
    crowd = run(
        ckpt,
        0,
        prompts,
        params,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=32,
        long_prefill_token_threshold=16,
        async_scheduling=True,
    )
    assert crowd.tokens["probe"] == alone


def test_k7_with_the_real_drafter_emits_the_k0_tokens(ckpt, alone):
    """At K=7 (the real drafter proposing with the shared noise) the probe and its neighbours
    must emit exactly their K=0 tokens."""
    prompts, params = requests(5)
    k0 = run(ckpt, 0, prompts, params, max_model_len=MAX_MODEL_LEN)
    k7 = run(ckpt, 7, prompts, params, max_model_len=MAX_MODEL_LEN)
    assert k7.tokens == k0.tokens
    assert k0.tokens["probe"] == alone
    assert k7.summary["num_verify_steps"] > 0


@pytest.mark.parametrize("error_at", [0, 3, 7])
def test_k7_with_the_test_drafter_accepts_error_at_plus_one_and_stays_exact(ckpt, alone, error_at):
    """A drafter proposing the K=0 samples, wrong at draft m, must accept m+1 per verify and
    leave the tokens unchanged (penalties see the tile's earlier drafts)."""
    prompts, params = requests(0)
    spec = {"cases": [{"prompt": prompts["probe"], "reference": alone, "error_at": error_at}]}
    traces = Traces()
    got = run(
        ckpt,
        7,
        prompts,
        params,
        max_model_len=MAX_MODEL_LEN,
        test_drafter=lambda: ScriptedDrafter(spec, VOCAB, 7),
        observers=[traces],
    )
    assert got.tokens["probe"] == alone
    lens = [
        a
        for t in traces.steps
        for a, nd, rid in zip(t.accepted_lens, t.accepted_num_drafts, t.accepted_req_ids)
        if nd and rid not in t.finished_req_ids
    ]
    assert lens and set(lens) == {error_at + 1}


def test_logprobs_and_prompt_logprobs_equal_log_softmax_of_the_models_logits(ckpt):
    """Sampled tokens' and prompt tokens' logprobs (a prompt prefilled in 5-token chunks)
    must equal log_softmax of transformers' logits for the same prefix (fp32), top entries
    sorted, the first prompt token None."""
    from transformers import DeepseekV4ForCausalLM

    model = DeepseekV4ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    p = prompt(7, 12, VOCAB)
    params = SamplingParams(
        max_tokens=6, seed=9, knobs=SamplingKnobs(temperature=1.0), logprobs=3, prompt_logprobs=2, ignore_eos=True
    )
    # NOTE: 5-token chunks: a chunk's last row is about the next chunk's first token
    got = run(ckpt, 0, {"r": p}, {"r": params}, max_model_len=MAX_MODEL_LEN, long_prefill_token_threshold=5)
    out = got.tokens["r"]
    seq = p + out
    with torch.no_grad(), lowest_index_ties():
        logits = model(torch.tensor([seq])).logits[0].double()  # [len, V]: row q predicts q+1
    ref = torch.log_softmax(logits, dim=-1)
    prompt_lps = got.prompt_logprobs["r"]
    assert prompt_lps[0].logprob is None and len(prompt_lps) == len(p)
    for q in range(1, len(seq)):
        e = prompt_lps[q] if q < len(p) else got.logprobs["r"][q - len(p)]
        assert e.token_id == seq[q]
        assert abs(e.logprob - float(ref[q - 1, seq[q]])) < 1e-4, q
        for t, lp in e.top:
            assert abs(lp - float(ref[q - 1, t])) < 1e-4
        tops = [lp for _, lp in e.top]
        assert tops == sorted(tops, reverse=True) and tops[0] >= float(ref[q - 1].max()) - 1e-4
        assert len(e.top) == (2 if q < len(p) else 3)


def test_a_preempted_sampled_request_resumes_with_identical_tokens(ckpt):
    """Requests that sample with penalties, squeezed into too few pages so some are preempted
    and recomputed (their outputs re-sent for the penalties), must emit exactly what they
    emit with room to spare, at K=0 and K=7."""
    prompts = {f"p{i}": prompt(200 + i, 20 + 3 * i, VOCAB) for i in range(4)}
    params = {k: SamplingParams(max_tokens=24, seed=i, **SAMPLED) for i, k in enumerate(prompts)}
    roomy = run(ckpt, 0, prompts, params, max_model_len=128)
    preemptions = 0
    for k in (0, 7):
        tight = run(ckpt, k, prompts, params, max_model_len=128, num_blocks=[64, 3, 64])  # c4 runs dry
        preemptions += tight.engine.scheduler.num_preemptions
        assert tight.tokens == roomy.tokens, k
    # NOTE: how often depends on when the engine admits each request; some must happen
    assert preemptions > 0
