"""PromptEncoder.encode_text: the same ids for any prompt length, a long one tokenised with
the GIL released (so accepting it in a worker thread never stalls the event loop)."""

from __future__ import annotations

import threading

from dspark_loop.api.prompt import GIL_FREE_CHARS, PromptEncoder
from dspark_testing.tiny_tokenizer import tiny_tokenizer


def test_ids_are_the_tokenizers_on_both_sides_of_the_gil_free_length():
    tok = tiny_tokenizer()
    enc = PromptEncoder(tok, bos_token_id=1, vocab_size=tok.get_vocab_size())
    unit = "def f(x):\n    return x * 2  # héllo 日本 😀\n"
    for n in (GIL_FREE_CHARS - 7, GIL_FREE_CHARS, GIL_FREE_CHARS + 5, 3 * GIL_FREE_CHARS):
        text = (unit * (n // len(unit) + 1))[:n]
        assert enc.encode_text(text) == [1, *tok.encode(text, add_special_tokens=False).ids]


def test_a_long_prompt_lets_other_threads_run_while_it_is_tokenised():
    """While a worker thread tokenises a long prompt, this thread must keep running (the
    event loop's thread, serving other streams): it gets far more turns than the two or
    three a GIL-holding `encode` of the same text allowed."""
    tok = tiny_tokenizer()
    enc = PromptEncoder(tok, bos_token_id=1, vocab_size=tok.get_vocab_size())
    text = "hello world " * 100_000
    worker = threading.Thread(target=enc.encode_text, args=(text,))
    turns = 0
    worker.start()
    while worker.is_alive():
        threading.Event().wait(0.0005)
        turns += 1
    assert turns > 20


def test_id_prompts_name_their_first_bad_item_and_an_over_long_one_is_refused_before_it_is_read():
    """check_ids must accept exactly the lists of ints in the vocab and name the first bad
    item (a bool, a float, a string, a negative, an id past the vocab, one past int64); an id
    list as long as the context is a context_length_exceeded 400 before its items are read."""
    import random

    import pytest

    from dspark_loop.api.errors import ApiError

    tok = tiny_tokenizer()
    vocab = tok.get_vocab_size()
    enc = PromptEncoder(tok, bos_token_id=1, vocab_size=vocab)
    rng = random.Random(5)
    bads = [True, 2.0, "7", -1, vocab, 2**70, None]
    for _ in range(200):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.7:
            for _ in range(rng.randint(1, 3)):
                ids[rng.randrange(len(ids))] = rng.choice(bads)
        first = next((i for i, t in enumerate(ids) if type(t) is not int or not 0 <= t < vocab), None)
        if first is None:
            assert enc.check_ids(ids, "prompt") == ids
            continue
        with pytest.raises(ApiError) as e:
            enc.check_ids(ids, "prompt")
        assert (
            f" {first} " in e.value.body()["error"]["message"] or f"item {first} " in e.value.body()["error"]["message"]
        )
    with pytest.raises(ApiError) as e:
        enc.completion_prompts([5] * 64 + ["not read"], max_len=64)
    assert e.value.body()["error"]["code"] == "context_length_exceeded"
