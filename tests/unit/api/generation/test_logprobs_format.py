"""Logprobs in the completions and chat response shapes."""

from dspark_loop.api.generation.logprobs_format import FLOOR, LogprobsFormatter
from dspark_loop.engine.outputs import TokenLogprob

TEXT = {1: "Hel", 2: "lo", 3: " world", 4: "!"}


def test_completion_logprobs_list_tokens_offsets_and_top_dicts_with_a_null_first_prompt_token():
    """Echoed prompt: the first token has null logprob and top; offsets accumulate the token
    strings; top entries keep their order, then the sampled token where it is not among them
    (OpenAI: up to logprobs + 1 entries); -inf is written as -9999.0."""
    f = LogprobsFormatter(TEXT.__getitem__)
    out, _ = f.completion(
        [
            TokenLogprob(1, None),
            TokenLogprob(2, -0.5, [(2, -0.5), (4, -1.0)]),
            TokenLogprob(3, float("-inf"), [(2, -0.1)]),
        ],
        text_offset=0,
    )
    assert out == {
        "tokens": ["Hel", "lo", " world"],
        "token_logprobs": [None, -0.5, FLOOR],
        "top_logprobs": [None, {"lo": -0.5, "!": -1.0}, {"lo": -0.1, " world": FLOOR}],
        "text_offset": [0, 3, 5],
    }


def test_chat_logprobs_carry_bytes_and_top_lists():
    """Chat entries: token, logprob, utf-8 bytes and a top list of the same shape."""
    out = LogprobsFormatter(TEXT.__getitem__).chat([TokenLogprob(4, -0.25, [(4, -0.25)])])
    assert out == {
        "content": [
            {
                "token": "!",
                "logprob": -0.25,
                "bytes": [33],
                "top_logprobs": [{"token": "!", "logprob": -0.25, "bytes": [33]}],
            }
        ]
    }
