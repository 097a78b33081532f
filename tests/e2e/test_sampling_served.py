"""Sampling over HTTP: a seed's tokens on one rank == on dp2/tp2/ep4, alone or among 31
other requests; n > 1 and batched prompts; logprobs (sampled and echoed prompt tokens)
equal transformers' log_softmax."""

from __future__ import annotations

import asyncio

import torch

from dspark_testing.prompts import mixed_prompts, token_prompt
from dspark_testing.stream_client import stream_completion
from dspark_testing.tie_rule import lowest_index_ties

SEEDED = {
    "max_tokens": 20,
    "temperature": 0.8,
    "top_p": 0.9,
    "top_k": 50,
    "min_p": 0.02,
    "presence_penalty": 0.3,
    "frequency_penalty": 0.2,
    "repetition_penalty": 1.1,
    "seed": 1234,
    "ignore_eos": True,
    "return_token_ids": True,
}
PROBE = token_prompt(37, seed=11)


async def test_a_seed_samples_the_same_tokens_on_every_topology_alone_and_among_31(server1, server4, http):
    """The seeded probe must stream the same tokens on one rank and on dp2/tp2/ep4, alone and
    beside 31 other sampling requests; another seed and greedy must give other tokens."""
    alone1 = server1.complete(PROBE, **SEEDED)["choices"][0]["token_ids"]
    alone4 = server4.complete(PROBE, **SEEDED)["choices"][0]["token_ids"]
    assert alone1 == alone4
    others = [
        {"prompt": p, "max_tokens": 12, "temperature": 1.0, "seed": i, "ignore_eos": True, "return_token_ids": True}
        for i, p in enumerate(mixed_prompts(31))
    ]
    bodies = [{"prompt": PROBE, **SEEDED}] + others
    results = await asyncio.gather(*(stream_completion(http, server4.url, b) for b in bodies))
    assert results[0].token_ids == alone1
    assert all(r.errors == [] and r.done for r in results)
    assert server4.complete(PROBE, **{**SEEDED, "seed": 99})["choices"][0]["token_ids"] != alone1
    greedy = server4.complete(PROBE, 20)["choices"][0]["token_ids"]
    assert greedy != alone1


def test_n_choices_over_batched_prompts_come_back_indexed_and_reproducible(server4):
    """Two prompts x n=3 must give 6 choices indexed i*3+j; a prompt's choices differ (their
    own noise); the same request again gives the same choices; usage counts all of them."""
    body = {
        "prompt": [PROBE, token_prompt(20, seed=4)],
        "n": 3,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 5,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    status, out = server4.post("/v1/completions", body)
    assert status == 200, out
    choices = out["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    first = [c["token_ids"] for c in choices[:3]]
    assert len({tuple(t) for t in first}) > 1
    assert server4.post("/v1/completions", body)[1]["choices"] == choices
    assert out["usage"]["completion_tokens"] == 6 * 8
    assert out["usage"]["prompt_tokens"] == len(PROBE) + 20


async def test_streamed_choices_carry_their_index_and_equal_the_whole_answer(server4, http):
    """n=2 streamed: each chunk names its choice; per index, the streamed tokens must equal
    the non-stream answer's."""
    body = {
        "prompt": PROBE,
        "n": 2,
        "max_tokens": 10,
        "temperature": 0.9,
        "seed": 8,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    whole = server4.post("/v1/completions", body)[1]["choices"]
    r = await stream_completion(http, server4.url, body)
    assert r.errors == [] and r.done
    by_index = {0: [], 1: []}
    for e in r.chunks:
        for c in e["choices"]:
            by_index[c["index"]] += c.get("token_ids", [])
    assert by_index == {c["index"]: c["token_ids"] for c in whole}


def test_echoed_prompt_and_sampled_logprobs_equal_transformers_log_softmax(server4, reference):
    """echo + logprobs=2 (what lm-evaluation-harness sends): the prompt's first token has null
    entries, every other token's logprob equals log_softmax of transformers' logits, and each
    top list holds the 2 best ids by logprob."""
    prompt = token_prompt(24, seed=6)
    status, out = server4.post(
        "/v1/completions",
        {
            "prompt": prompt,
            "max_tokens": 3,
            "echo": True,
            "logprobs": 2,
            "temperature": 0.7,
            "seed": 3,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, out
    choice = out["choices"][0]
    seq = prompt + choice["token_ids"]
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(seq) and lp["token_logprobs"][0] is None
    with torch.no_grad(), lowest_index_ties():
        logits = reference.model(torch.tensor([seq])).logits[0].double()
    ref = torch.log_softmax(logits, dim=-1)
    for q in range(1, len(seq)):
        assert abs(lp["token_logprobs"][q] - float(ref[q - 1, seq[q]])) < 1e-4, q
        top = lp["top_logprobs"][q]
        assert 1 <= len(top) <= 3  # the 2 likeliest and the sampled token (OpenAI's logprobs + 1)
        assert lp["tokens"][q] in top  # (keyed by text: two partial-UTF-8 tokens may share "\ufffd")
        assert abs(max(top.values()) - float(ref[q - 1].max())) < 1e-4


async def test_chat_n_choices_with_logprobs_stream_and_whole_agree(server4, http):
    """Chat n=2 with logprobs: two indexed choices, each token's entry with a 2-long top list;
    the streamed deltas per index must spell the whole answer's messages; the same seed
    again gives the same answer."""
    body = {
        "messages": [{"role": "user", "content": "Say something."}],
        "n": 2,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 21,
        "logprobs": True,
        "top_logprobs": 2,
        "ignore_eos": True,
    }
    status, out = server4.post("/v1/chat/completions", body)
    assert status == 200, out
    choices = out["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    for c in choices:
        entries = c["logprobs"]["content"]
        assert entries and all(len(e["top_logprobs"]) == 2 for e in entries)
        assert all(e["logprob"] <= e["top_logprobs"][0]["logprob"] + 1e-6 for e in entries)
    assert sum(len(c["logprobs"]["content"]) for c in choices) == out["usage"]["completion_tokens"]
    assert server4.post("/v1/chat/completions", body)[1]["choices"] == choices
    r = await stream_completion(http, server4.url, {**body, "stream": True}, path="/v1/chat/completions")
    assert r.errors == [] and r.done
    text = {0: "", 1: ""}
    for e in r.chunks:
        for c in e["choices"]:
            d = c["delta"]
            text[c["index"]] += (d.get("content") or "") + (d.get("reasoning_content") or "")
    for c in choices:
        m = c["message"]
        assert text[c["index"]] == (m.get("content") or "") + (m.get("reasoning_content") or "")


def test_echoed_text_offsets_index_the_returned_text(server4):
    """With echo and logprobs on a text prompt, each token's text_offset must point at it in
    the returned text; a token the text does not spell (the BOS the server prepends, a special
    token the answer skips) starts where the next one does and adds no length."""
    status, out = server4.post(
        "/v1/completions",
        {"prompt": "def add(a, b):", "max_tokens": 4, "echo": True, "logprobs": 1, "temperature": 0},
    )
    assert status == 200, out
    text, lp = out["choices"][0]["text"], out["choices"][0]["logprobs"]
    assert text.startswith("def add(a, b):") and lp["text_offset"][:2] == [0, 0]
    offsets = lp["text_offset"] + [len(text)]
    for i, tok in enumerate(lp["tokens"]):
        if "\ufffd" not in tok:  # a piece of a character spells as U+FFFD, not as the text
            off = offsets[i]
            assert text[off : off + len(tok)] == tok or offsets[i + 1] == off, (tok, off, text)
