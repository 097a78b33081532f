"""Incremental detokenisation with stop strings, one Detokenizer per request.

Deltas never contain broken UTF-8: a token that ends inside a multi-byte character
contributes nothing until the character completes. Text that could still be the start of
a stop string is held back until the next tokens decide it. Special tokens produce no text
unless asked for (skip_special_tokens=False: all; keep_special: those named).

Two decoding paths, chosen once per tokenizer by TokenText:
- byte-level BPE (DeepSeek's tokenizer): a table of the bytes of every token id and an
  incremental UTF-8 decoder; about a microsecond per token, no tokenizer call.
- anything else: re-decode a short window of ids with the tokenizer (prefix/read offsets)
  and emit what grew, unless it ends in U+FFFD (a partial character).
"""

from __future__ import annotations

import codecs
import functools
import json

REPLACEMENT = "\ufffd"


@functools.lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's printable stand-in character for each of the
    256 bytes), inverted: stand-in character -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return {c: b for b, c in chars.items()}


@functools.lru_cache(maxsize=4)
def special_token_ids(tokenizer) -> frozenset[int]:
    """A tokenizer's special ids (>100k for Flash: placeholders), worked out once per tokenizer
    for the engine's text (TokenText) and the API's logprob offsets alike."""
    return frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)


class TokenText:
    """What a tokenizer's ids read as; built once per tokenizer and shared."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder()  # {id: AddedToken}
        self.special_ids = special_token_ids(tokenizer)
        self.special_text = {i: t.content for i, t in added.items() if t.special}
        self.token_bytes: list[bytes] | None = None  # id -> bytes, special tokens b""
        # spelling()'s answers, by (skip_special_tokens, keep_special): built once, shared
        self._spellings: dict[tuple[bool, frozenset[str]], tuple[dict[int, str], list[bytes]]] = {}
        decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
        kinds = [d.get("type") for d in decoder.get("decoders", [decoder])]
        if kinds == ["ByteLevel"]:
            table = self._byte_table(tokenizer, added)
            self.token_bytes = table if self._agrees_with_tokenizer(table) else None

    @property
    def byte_level(self) -> bool:
        return self.token_bytes is not None

    def spelling(self, skip_special_tokens: bool, keep_special: tuple[str, ...]) -> tuple[dict[int, str], list[bytes]]:
        """The special ids a request spells as their text (all of them; skipping, those in
        keep_special) and, byte-level, the id -> bytes table that spells them (else []).
        Built once per choice: a vocabulary can hold >100k special ids (placeholders), too
        many to filter per request."""
        key = (skip_special_tokens, frozenset(keep_special) if skip_special_tokens else frozenset())
        got = self._spellings.get(key)
        if got is None:
            special = self.special_text
            spelled = special if not skip_special_tokens else {i: t for i, t in special.items() if t in key[1]}
            table: list[bytes] = []
            if self.token_bytes is not None:
                table = list(self.token_bytes) if spelled else self.token_bytes
                for i, t in spelled.items():
                    if i < len(table):
                        table[i] = t.encode("utf-8")
            got = self._spellings[key] = (spelled, table)
        return got

    def _byte_table(self, tokenizer, added) -> list[bytes]:
        alphabet = byte_level_alphabet()
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        table = [b""] * (max(vocab.values(), default=-1) + 1)
        for piece, i in vocab.items():
            if i in added:
                tok = added[i]
                table[i] = b"" if tok.special else tok.content.encode("utf-8")
            elif all(c in alphabet for c in piece):
                table[i] = bytes(alphabet[c] for c in piece)
            else:
                table[i] = piece.encode("utf-8")
        return table

    def _agrees_with_tokenizer(self, table: list[bytes]) -> bool:
        # NOTE: a sanity check, not a proof: some byte-level tokenizers add normalising
        # decoders we do not model; if a sample disagrees we use the generic path.
        n = len(table)
        sample = list(range(0, n, max(1, n // 512)))
        mine = b"".join(table[i] for i in sample).decode("utf-8", "replace")
        return mine == self.tokenizer.decode(sample, skip_special_tokens=True)


class Detokenizer:
    """Feed tokens with add(); take released text with take_delta(); finish() at the end."""

    def __init__(
        self,
        text: TokenText,
        stop: list[str] | tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        keep_special: tuple[str, ...] = (),
    ):
        self._text = text
        # special ids spelled as their text: all of them, or (skipping) those in keep_special
        self._spelled, table = text.spelling(skip_special_tokens, keep_special)
        self._stops = [s for s in stop if s]
        self._include_stop = include_stop_str_in_output
        self._stop_firsts = {s[0] for s in self._stops}
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._pending = ""  # decoded, not yet released
        self._held = 0  # trailing chars of _pending that may start a stop string
        self.stop_matched: str | None = None
        # plain: byte-level with no stop strings, so feed() decodes a whole list at once
        self.plain = text.byte_level and not self._stops
        self._table = table  # id -> bytes (byte-level tokenizers)
        if text.token_bytes is not None:  # text.byte_level
            self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        else:
            self._ids: list[int] = []
            self._prefix_offset = 0
            self._read_offset = 0

    def add(self, token_id: int, check_stop: bool = True) -> str | None:
        """Append one token; returns the stop string if this token completed one."""
        if self.stop_matched is not None:
            raise RuntimeError("token added after a stop string matched")
        new = self._decode(token_id)
        if not new:
            return None
        self._pending += new
        if self._stops:
            if check_stop and self._find_stop():
                return self.stop_matched
            self._held = self._hold_len()
        return None

    def feed(self, token_ids: list[int]) -> str:
        """A plain detokenizer's text for token_ids (what add() + take_delta() would give:
        a special token's text after a broken character reads as U+FFFD then the text,
        exactly as add() flushes it)."""
        table = self._table
        try:
            data = b"".join([table[t] for t in token_ids])
        except IndexError:  # an id past the vocabulary reads as nothing, as in add()
            data = b"".join([table[t] if t < len(table) else b"" for t in token_ids])
        return self._pending_take() + self._utf8.decode(data)

    def _pending_take(self) -> str:
        if not self._pending:
            return ""
        out, self._pending = self._pending, ""
        return out

    def take_delta(self) -> str:
        if not self._held:
            delta, self._pending = self._pending, ""
            return delta
        n = len(self._pending) - self._held
        delta, self._pending = self._pending[:n], self._pending[n:]
        return delta

    def finish(self) -> str:
        """Everything still held back (the request ended: nothing can match any more)."""
        if self.stop_matched is None and self._text.byte_level:
            self._pending += self._utf8.decode(b"", final=True)
        self._held = 0
        return self.take_delta()

    # ---- internals --------------------------------------------------------------------
    def _decode(self, token_id: int) -> str:
        if self._spelled and token_id in self._spelled:
            # NOTE: chat output needs </think> and ｜DSML｜ as text to split reasoning and
            # tool calls; a special token never splits a character, so flushing is safe.
            return self._flush() + self._spelled[token_id]
        if self._text.byte_level:
            # NOTE: _table, not token_bytes: the two differ only at special ids, handled above
            table = self._table
            return self._utf8.decode(table[token_id]) if token_id < len(table) else ""
        self._ids.append(token_id)
        decode = self._text.tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        full = decode(self._ids[self._prefix_offset :], skip_special_tokens=True)
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT):
            return ""  # a partial character: wait for the next token
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(prefix) :]

    def _flush(self) -> str:
        """Bytes of a character left incomplete before a special token, as U+FFFD."""
        if self._text.byte_level:
            return self._utf8.decode(b"", final=True)
        return ""

    def _find_stop(self) -> bool:
        best, best_at = None, -1
        for s in self._stops:
            i = self._pending.find(s)
            if i >= 0 and (best is None or i < best_at):
                best, best_at = s, i
        if best is None:
            return False
        end = best_at + len(best) if self._include_stop else best_at
        self._pending = self._pending[:end]
        self._held = 0
        self.stop_matched = best
        return True

    def _hold_len(self) -> int:
        """The longest tail of _pending that is a proper prefix of a stop string (held back:
        the next tokens may complete it). Linear in the stop strings' length: a tail is
        compared only where it starts with a stop string's first character."""
        p, firsts = self._pending, self._stop_firsts
        for k in range(min(self._max_hold, len(p)), 0, -1):
            if p[-k] in firsts:
                tail = p[-k:]
                if any(len(s) > k and s.startswith(tail) for s in self._stops):
                    return k
        return 0


def output_text(text: Detokenizer, out, include_stop_str_in_output: bool) -> str:
    """A plain request's text delta for out's tokens: a finishing EOS or stop id adds no
    text (unless include_stop_str_in_output), and the end flushes a broken character."""
    ids = out.new_token_ids
    if out.finish_reason == "stop" and not include_stop_str_in_output:
        ids = ids[:-1]
    delta = text.feed(ids)
    return delta + text.finish() if out.finished and out.finish_reason != "error" else delta
