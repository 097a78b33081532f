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
