"""Finish checks after each update: EOS, min_tokens, ignore_eos, stop ids, stop strings."""

from dspark_testing.tiny_tokenizer import eos_id
from tests.unit.engine.factories import make_mesh, make_requests, make_scheduler, run_to_completion, text_of, tokens_of
from tests.unit.engine.test_detokenize import byte_tokens

PROMPT_LEN = 6


def scripted(seq):
    """The fake model emits seq[k] as output token k (produced at position prompt_len-1+k)."""

    def script(tok, prev, pos):
        k = pos - (PROMPT_LEN - 1)
        return seq[k] if 0 <= k < len(seq) else None

    return script


def run_one(seq, **params):
    sched = make_scheduler()
    mesh = make_mesh(sched, scripted(seq))
    (r,) = make_requests(sched, 1, prompt_len=PROMPT_LEN, **params)
    sched.add(r)
    outs = run_to_completion(sched, mesh)["req-0"]
    assert sched.partitions[0].cache.num_free() == [32, 16]  # finished -> pages freed
    return outs


def test_eos_finishes_with_stop_and_counts_as_a_token():
    """EOS must finish the request with "stop"; the EOS id is delivered, its text is not."""
    outs = run_one(byte_tokens("ok") + [eos_id()])
    assert tokens_of(outs) == byte_tokens("ok") + [eos_id()]
    assert text_of(outs) == "ok" and outs[-1].finish_reason == "stop"
    assert outs[-1].num_output_tokens == 3


def test_eos_before_min_tokens_does_not_finish():
    """EOS earlier than min_tokens outputs must be treated as an ordinary token."""
    outs = run_one([eos_id()] * 4 + byte_tokens("zz"), min_tokens=3)
    assert tokens_of(outs) == [eos_id()] * 3 and outs[-1].finish_reason == "stop"


def test_ignore_eos_runs_until_max_tokens():
    """With ignore_eos, EOS must not finish; max_tokens must finish with "length"."""
    outs = run_one([eos_id()] * 5, ignore_eos=True, max_tokens=4)
    assert tokens_of(outs) == [eos_id()] * 4 and outs[-1].finish_reason == "length"


def test_stop_token_id_finishes_and_names_the_token():
    """A stop_token_ids hit must finish with "stop" and stop_reason = that id."""
    seq = byte_tokens("abc")
    outs = run_one(seq, stop_token_ids=[seq[1]])
    assert tokens_of(outs) == seq[:2] and text_of(outs) == "a"
    assert (outs[-1].finish_reason, outs[-1].stop_reason) == ("stop", seq[1])


def test_stop_string_across_token_boundaries_ends_the_text_before_it():
    """A stop string split over several tokens must finish the request at the token that
    completes it, with the text cut before the stop string and held text never leaked."""
    seq = byte_tokens("hi STOP more text")
    outs = run_one(seq, stop=["STOP"])
    assert tokens_of(outs) == seq[: len("hi STOP")]
    assert [o.new_text for o in outs] == ["h", "i", " ", "", "", "", ""]
    assert (outs[-1].finish_reason, outs[-1].stop_reason) == ("stop", "STOP")


def test_multibyte_output_arrives_as_whole_characters():
    """Request deltas must never contain a partial UTF-8 character."""
    seq = byte_tokens("日本😀")
    outs = run_one(seq, max_tokens=len(seq))
    assert [o.new_text for o in outs] == ["", "", "日", "", "", "本", "", "", "", "😀"]
