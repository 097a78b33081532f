"""ToolConstraint: a token mask that only lets the model write a valid DSML tool block.

Built from tool_call_grammar's EBNF and the serving tokenizer; xgrammar compiles the grammar
against the vocab and fills a bitmask per step. In thinking mode the grammar starts after
the `</think>` token; before it every token is allowed except `｜DSML｜` (no block inside the
reasoning) and, unless tool_choice is "auto", EOS (the call is required). Greedy only: the mask is applied to argmax.

    ToolConstraint.build(tokenizer, tools, tool_choice, start_in_reasoning=...)
    mask = c.allowed_token_mask(generated_ids)   # [vocab] bool
    c.accept(token_id); c.is_terminated()
"""

from __future__ import annotations

import functools

import numpy as np
import xgrammar as xg

from dspark_loop.api.chat.render import DSML, EOS, THINK_END
from dspark_loop.api.chat.tool_grammar import tool_call_grammar
from dspark_loop.engine.detokenize import byte_level_alphabet


def vocab_bytes(tokenizer, vocab_size: int) -> list[bytes]:
    """Each id's exact bytes: byte-level pieces decoded, added tokens as their text."""
    added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
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
def _compiler(tokenizer, vocab_size: int, eos_id: int) -> xg.GrammarCompiler:
    info = xg.TokenizerInfo(
        vocab_bytes(tokenizer, vocab_size), xg.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=[eos_id]
    )
    return xg.GrammarCompiler(info, max_threads=1)


class ToolConstraint:
    def __init__(
        self,
        matcher: xg.GrammarMatcher,
        vocab_size: int,
        *,
        eos_id: int,
        think_end_id: int | None,
        dsml_id: int | None,
        max_rollback: int,
        call_required: bool = True,
    ):
        self._matcher = matcher
        self.vocab_size = vocab_size
        self._eos_id, self._think_end_id = eos_id, think_end_id
        # Tokens refused while reasoning: no block inside it, no end before a required call.
        self._reasoning_refused = {t for t in (dsml_id, eos_id if call_required else None) if t is not None}
        self._max_rollback = max_rollback
        self._ids: list[int] = []  # every token accepted so far
        self._grammar_start = 0 if think_end_id is None else None  # index where grammar began
        self._bitmask = np.zeros(xg.get_bitmask_shape(1, vocab_size), dtype=np.int32)  # [1, words]

    @classmethod
    def build(
        cls,
        tokenizer,
        tools: list[dict],
        tool_choice,
        *,
        start_in_reasoning: bool,
        vocab_size: int | None = None,
        parallel_tool_calls: bool = True,
        max_value_len: int | None = None,
        max_rollback: int = 16,
    ) -> ToolConstraint:
        """Raises UnsupportedToolSchema (from the grammar) before anything is generated."""
        vocab_size = vocab_size or tokenizer.get_vocab_size(with_added_tokens=True)
        eos_id = tokenizer.token_to_id(EOS)
        grammar = tool_call_grammar(
            tools, tool_choice, parallel_tool_calls=parallel_tool_calls, max_value_len=max_value_len
        )
        compiled = _compiler(tokenizer, vocab_size, eos_id).compile_grammar(grammar)
        matcher = xg.GrammarMatcher(compiled, max_rollback_tokens=max_rollback)
        think_end = tokenizer.token_to_id(THINK_END) if start_in_reasoning else None
        return cls(
            matcher,
            vocab_size,
            eos_id=eos_id,
            think_end_id=think_end,
            dsml_id=tokenizer.token_to_id(DSML),
            max_rollback=max_rollback,
            call_required=tool_choice != "auto",
        )

    def _sync(self, generated_ids: list[int]) -> None:
        """Make the accepted history equal `generated_ids` (rolling back rejected drafts)."""
        common = 0
        for a, b in zip(self._ids, generated_ids):
            if a != b:
                break
            common += 1
        if common < len(self._ids):
            start = self._grammar_start
            if start is not None and common >= start and len(self._ids) - common <= self._max_rollback:
                self._matcher.rollback(len(self._ids) - common)
                del self._ids[common:]
            else:
                # NOTE: beyond the rollback window (or back into the reasoning) replay from
                # scratch; the matcher cannot rewind further.
                replay = generated_ids[:common]
                self._matcher.reset()
                self._ids = []
                self._grammar_start = 0 if self._think_end_id is None else None
                generated_ids = replay + list(generated_ids[common:])
        for tid in generated_ids[len(self._ids) :]:
            if not self.accept(tid):
                raise ValueError(f"token {tid} breaks the tool-call grammar")

    def allowed_token_mask(self, generated_ids: list[int]) -> np.ndarray:
        """[vocab] bool: the tokens that may follow `generated_ids`."""
        self._sync(list(generated_ids))
        if self._grammar_start is None:
            mask = np.ones(self.vocab_size, dtype=bool)
            mask[list(self._reasoning_refused)] = False
            return mask
        if self._matcher.is_terminated():  # EOS accepted: nothing may follow but padding
            mask = np.zeros(self.vocab_size, dtype=bool)
            mask[self._eos_id] = True
            return mask
        self._matcher.fill_next_token_bitmask(self._bitmask)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
        return bits[: self.vocab_size].astype(bool)

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the grammar forbids it."""
        if self._grammar_start is None:
            if token_id in self._reasoning_refused:
                return False
            self._ids.append(token_id)
            if token_id == self._think_end_id:
                self._grammar_start = len(self._ids)
            return True
        if not self._matcher.accept_token(token_id):
            return False
        self._ids.append(token_id)
        return True

    def is_terminated(self) -> bool:
        return self._grammar_start is not None and self._matcher.is_terminated()
