"""xgrammar compilers for the serving tokenizer, and a bounded cache of compiled grammars.

The vocab is compiled once per (tokenizer, vocab size, EOS); a grammar once per canonical
key (the schema's JSON with sorted keys, or the tools' and tool_choice's), kept in an LRU
of MAX_GRAMMARS. Compiling is slow (milliseconds to seconds): callers run it off the loop
(asyncio.to_thread), hence the lock.

    compiled = compile_cached(tokenizer, vocab_size, key, lambda c: c.compile_json_schema(...))
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict

import xgrammar as xg

from dspark_loop.api.chat.render import CHAT_MARKERS, EOS
from dspark_loop.engine.detokenize import byte_level_alphabet

MAX_GRAMMARS = 256
_cache: OrderedDict[tuple, xg.CompiledGrammar] = OrderedDict()
_lock = threading.Lock()


def vocab_bytes(tokenizer, vocab_size: int) -> list[bytes]:
    """Each id's exact bytes: byte-level pieces decoded, added tokens as their text, except
    special tokens that are neither EOS nor a chat marker: empty, which xgrammar never
    matches (a grammar cannot put a placeholder or a turn marker inside a JSON string; the
    answer's text would drop it)."""
    spelled = (EOS, *CHAT_MARKERS)
    added = {
        i: t.content if not t.special or t.content in spelled else ""
        for i, t in tokenizer.get_added_tokens_decoder().items()
    }
    to_byte = byte_level_alphabet()
    out = [b""] * vocab_size
    for piece, i in tokenizer.get_vocab(with_added_tokens=False).items():
        if i < vocab_size and i not in added:
            try:
                out[i] = bytes(to_byte[c] for c in piece)
            except KeyError:
                raise ValueError(f"token {piece!r} is not byte-level BPE") from None
    for i, text in added.items():
        if i < vocab_size:
            out[i] = text.encode("utf-8")
    return out


@functools.lru_cache(maxsize=4)
def compiler_for(tokenizer, vocab_size: int) -> xg.GrammarCompiler:
    eos_id = tokenizer.token_to_id(EOS)
    info = xg.TokenizerInfo(
        vocab_bytes(tokenizer, vocab_size), xg.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=[eos_id]
    )
    return xg.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def canonical(value) -> str:
    """The cache key text of a JSON value: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def compile_cached(tokenizer, vocab_size: int, key: tuple, build) -> xg.CompiledGrammar:
    """build(compiler) -> CompiledGrammar, once per key (LRU of MAX_GRAMMARS)."""
    full = (id(tokenizer), vocab_size, *key)
    with _lock:
        hit = _cache.get(full)
        if hit is not None:
            _cache.move_to_end(full)
            return hit
    compiled = build(compiler_for(tokenizer, vocab_size))
    with _lock:
        _cache[full] = compiled
        while len(_cache) > MAX_GRAMMARS:
            _cache.popitem(last=False)
    return compiled


def cache_size() -> int:
    return len(_cache)
