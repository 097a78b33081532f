"""forced_tokens: the one id a bitmask row allows, vectorised over a fill's rows."""

import numpy as np
import pytest

pytest.importorskip("xgrammar")

from dspark_loop.api.structured.grammar_constraint import forced_token, forced_tokens  # noqa: E402


def reference(row: np.ndarray) -> int:
    """The id of the only set bit of the row's little-endian int32 words, -1 if not one."""
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")
    ids = np.flatnonzero(bits)
    return int(ids[0]) if len(ids) == 1 else -1


def test_forced_tokens_agree_with_the_bits_for_every_kind_of_row():
    """Rows with no bit, one bit (every position of a word, the sign bit included, in the
    first and last word), two bits in one word and one bit in each of two words must give
    the single set bit's id or -1, as a bit-by-bit reading does."""
    words = 5
    rows = [np.zeros(words, np.int32)]
    for w in (0, 2, words - 1):
        for b in (0, 1, 17, 30, 31):
            r = np.zeros(words, np.uint32)
            r[w] = np.uint32(1) << np.uint32(b)
            rows.append(r.view(np.int32))
    two_in_one = np.zeros(words, np.uint32)
    two_in_one[1] = 0b1001
    one_in_two = np.zeros(words, np.uint32)
    one_in_two[[0, 3]] = 1 << 31
    rows += [two_in_one.view(np.int32), one_in_two.view(np.int32)]
    rng = np.random.default_rng(0)
    rows += [rng.integers(-(2**31), 2**31, words, dtype=np.int64).astype(np.int32) for _ in range(20)]
    bitmask = np.stack(rows)  # [n, words]
    want = [reference(r) for r in bitmask]
    assert forced_tokens(bitmask).tolist() == want
    assert [forced_token(r) for r in bitmask] == [None if t < 0 else t for t in want]
    assert want.count(-1) >= 23 and len(set(want) - {-1}) == 15  # both kinds are exercised
