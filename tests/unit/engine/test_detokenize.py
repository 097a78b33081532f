from dspark_loop.engine.detokenize import Detokenizer, TokenText, byte_level_alphabet
from dspark_testing.tiny_tokenizer import eos_id, tiny_tokenizer
from tests.unit.engine.factories import token_text

_CHAR = {b: c for c, b in byte_level_alphabet().items()}


def byte_tokens(text: str) -> list[int]:
    """One token per UTF-8 byte, so multi-byte characters span several tokens."""
    tok = tiny_tokenizer()
    return [tok.token_to_id(_CHAR[b]) for b in text.encode("utf-8")]


def feed(det: Detokenizer, ids) -> list[str]:
    deltas = []
    for t in ids:
        det.add(t)
        deltas.append(det.take_delta())
    return deltas


def test_byte_level_table_matches_the_tokenizer():
    """The byte table must decode every id exactly as tokenizer.decode does."""
    tt = token_text()
    assert tt.byte_level
    ids = tiny_tokenizer().encode("héllo wörld 日本語 😀 STOP <eos> done").ids
    assert "".join(feed(Detokenizer(tt), ids)) == tiny_tokenizer().decode(ids)


def test_multibyte_characters_are_never_split_across_deltas():
    """A delta must only ever contain whole characters; a partial one waits."""
    text = "a日😀é"
    deltas = feed(Detokenizer(token_text()), byte_tokens(text))
    assert deltas == ["a", "", "", "日", "", "", "", "😀", "", "é"]


def test_generic_path_holds_back_partial_characters_too():
    """Without the byte table (other tokenizers) deltas must still be whole characters."""
    tt = TokenText(tiny_tokenizer())
    tt.token_bytes = None  # force the re-decode path
    text = "x😀 日本"
    deltas = feed(Detokenizer(tt), byte_tokens(text))
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[1:5] == ["", "", "", "😀"]


def test_special_tokens_produce_no_text():
    """Special tokens (EOS, BOS) must be skipped in the text."""
    assert feed(Detokenizer(token_text()), [eos_id()] + byte_tokens("ok")) == ["", "o", "k"]


def test_stop_string_across_tokens_is_held_back_then_cut():
    """Text that may start a stop string must be held until decided; the stop string
    and everything after it must not appear in the output."""
    det = Detokenizer(token_text(), stop=["STOP"])
    deltas = []
    for t in byte_tokens("hi STOP after"):
        if det.add(t) is not None:
            deltas.append(det.finish())
            break
        deltas.append(det.take_delta())
    assert deltas == ["h", "i", " ", "", "", "", ""]
    assert det.stop_matched == "STOP"


def test_held_text_is_released_when_the_stop_string_does_not_complete():
    """A held prefix ("ST") must be released as soon as the next text rules it out."""
    det = Detokenizer(token_text(), stop=["STOP"])
    assert feed(det, byte_tokens("aSTx")) == ["a", "", "", "STx"]
    assert det.finish() == ""


def test_include_stop_str_in_output_keeps_the_stop_string():
    """With include_stop_str_in_output the output must end with the stop string."""
    det = Detokenizer(token_text(), stop=["STOP", "end"], include_stop_str_in_output=True)
    out = ""
    for t in byte_tokens("the end STOP"):
        if det.add(t):
            out += det.finish()
            break
        out += det.take_delta()
    assert out == "the end" and det.stop_matched == "end"


def test_finish_flushes_held_text_and_an_incomplete_character():
    """At the end nothing may be lost: held text is released, a dangling byte becomes U+FFFD."""
    det = Detokenizer(token_text(), stop=["STOP"])
    assert feed(det, byte_tokens("aS")) == ["a", ""]
    det.add(byte_tokens("日")[0])
    assert det.finish() == "S\ufffd"


def test_feed_gives_the_text_of_add_and_take_delta_for_any_split():
    """feed() (a plain detokenizer: no stop strings) must give exactly the text of adding
    the same ids one by one -- broken characters, special tokens either way, ids past the
    vocabulary -- however the ids are split into steps."""
    import random

    tt = token_text()
    specials = sorted(tt.special_ids)
    vocab = len(tt.token_bytes)
    pool = byte_tokens("a日😀é z") + specials + [vocab + 5] + tiny_tokenizer().encode("héllo 日本語 😀").ids
    rng = random.Random(0)
    for trial in range(200):
        ids = [rng.choice(pool) for _ in range(rng.randint(0, 24))]
        skip = trial % 2 == 0
        one, bulk = Detokenizer(tt, skip_special_tokens=skip), Detokenizer(tt, skip_special_tokens=skip)
        assert bulk.plain
        expected = "".join(feed(one, ids)) + one.finish()
        got, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 8)
            got.append(bulk.feed(ids[i : i + n]))
            i += n
        assert "".join(got) + bulk.finish() == expected, (ids, skip)


def test_stop_strings_make_a_detokenizer_walk_tokens():
    """A detokenizer with stop strings must not be plain: the engine walks its tokens."""
    assert not Detokenizer(token_text(), stop=["STOP"]).plain


class CountingItems(dict):
    """A special_text that counts the walks over it."""

    walks = 0

    def items(self):
        self.walks += 1
        return super().items()


def test_a_requests_special_token_choice_is_worked_out_once_per_tokenizer_not_per_request():
    """Flash's tokenizer has >100k special ids (placeholders): walking them for every new
    request cost the host ~8 ms a request at admission. Requests making the same choice
    (skip_special_tokens, keep_special) share what it spells."""
    tt = TokenText(tiny_tokenizer())
    tt.special_text = special = CountingItems(tt.special_text)
    eos_text = tt.special_text[eos_id()]
    dets = [Detokenizer(tt, keep_special=(eos_text,)) for _ in range(50)]
    dets += [Detokenizer(tt) for _ in range(50)]
    assert special.walks <= 2
    for det in (dets[0], dets[-1], Detokenizer(tt, skip_special_tokens=False)):
        assert feed(det, byte_tokens("a")) == ["a"]
    spelled = Detokenizer(tt, keep_special=(eos_text,))
    assert "".join(feed(spelled, [eos_id()] + byte_tokens("ok"))) == eos_text + "ok"
    assert "".join(feed(dets[-1], [eos_id()] + byte_tokens("ok"))) == "ok"


def test_held_text_is_the_longest_tail_that_begins_a_stop_string():
    """What add() holds back must be, by definition, the longest tail of the unreleased text
    that is a proper prefix of some stop string, for any text and stop strings."""
    import random

    rng = random.Random(3)
    for _ in range(300):
        stops = ["".join(rng.choice("ab\n") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice("ab\nc") for _ in range(rng.randint(0, 12)))
        det = Detokenizer(token_text(), stop=stops)
        for t in byte_tokens(text):
            if det.add(t, check_stop=False) is not None:
                break
        held = max(
            (k for k in range(1, len(text) + 1) for s in stops if len(s) > k and s.startswith(text[-k:])), default=0
        )
        assert det.take_delta() == text[: len(text) - held]


def test_a_very_long_stop_string_costs_memory_linear_in_its_length():
    """A client's 20,000-character stop string must cost the detokenizer about its own size,
    not one copy per prefix (a 1 MB stop string once took the whole machine's memory)."""
    import tracemalloc

    stop = "ab" * 10_000
    tracemalloc.start()
    det = Detokenizer(token_text(), stop=[stop])
    deltas = feed(det, byte_tokens("xabab"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000
    assert deltas == ["x", "", "", "", ""] and det.finish() == "abab"  # held: it may begin the stop
