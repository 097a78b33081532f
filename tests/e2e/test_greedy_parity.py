"""Served greedy tokens over HTTP, 4 ranks (dp2/tp2/ep4), against transformers in fp32."""

from __future__ import annotations

import pytest

from dspark_testing.prompts import TEXTS, token_prompt

TEXT_CASES = [(TEXTS[0], 12), (TEXTS[3], 10)]
# 1 token; crossing the 16-token window and ratio-16 boundaries; crossing a 32-token page
# and several compressed rows.
ID_CASES = [([0], 8), (token_prompt(19, seed=1), 10), (token_prompt(70, seed=2), 12)]


@pytest.mark.parametrize("text,num_new", TEXT_CASES, ids=["hello", "story"])
def test_text_prompt_tokens_equal_transformers_greedy(server4, reference, text, num_new):
    """A string prompt must be served BOS + its tokens, and the greedy completion must be
    token-for-token transformers' greedy generate() on those ids."""
    out = server4.complete(text, num_new)
    choice = out["choices"][0]
    prompt_ids = choice["prompt_token_ids"]
    assert prompt_ids[0] == 0, "the API prepends BOS to a string prompt"
    assert choice["token_ids"] == reference.generate(prompt_ids, num_new)
    assert out["usage"]["completion_tokens"] == num_new
    assert choice["finish_reason"] == "length"


@pytest.mark.parametrize("prompt,num_new", ID_CASES, ids=["bos-only", "19-ids", "70-ids"])
def test_token_id_prompt_tokens_equal_transformers_greedy(server4, reference, prompt, num_new):
    """A token-id prompt must be served as given and its greedy completion must equal
    transformers' greedy generate()."""
    choice = server4.complete(prompt, num_new)["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    assert choice["token_ids"] == reference.generate(prompt, num_new)


def test_completion_text_is_the_detokenised_token_ids(server4, tiny_ckpt):
    """The completion's text must be exactly the tokenizer's decoding of its token ids."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{tiny_ckpt}/tokenizer.json")
    choice = server4.complete(TEXTS[2], 8)["choices"][0]
    assert choice["text"] == tok.decode(choice["token_ids"], skip_special_tokens=False)


@pytest.fixture(scope="module")
def server4_async(tiny_ckpt):
    """The 4-rank server with --async-scheduling: plans go to the ranks one step ahead."""
    from dspark_testing.server_process import ServerProcess
    from tests.e2e.conftest import TOPOLOGY_4

    server = ServerProcess(["--model", tiny_ckpt, *TOPOLOGY_4, "--async-scheduling"])
    yield server
    code = server.stop()
    assert code == 0, server.log()[-4000:]


def test_async_scheduling_serves_transformers_greedy_tokens_to_concurrent_requests(server4_async, reference):
    """With two steps in flight on real ranks (placeholders resolved by every TP rank of a
    group), concurrent token-id requests must each get transformers' greedy tokens."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(ID_CASES)) as pool:
        choices = list(pool.map(lambda c: server4_async.complete(c[0], c[1])["choices"][0], ID_CASES))
    for (prompt, num_new), choice in zip(ID_CASES, choices):
        assert choice["token_ids"] == reference.generate(prompt, num_new)
