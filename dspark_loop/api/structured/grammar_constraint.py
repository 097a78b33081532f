"""GrammarConstraint: the tokens a constrained request may write next, row by row.

One compiled xgrammar grammar (a JSON schema, json_object, or the DSML tool-call tag) and
its matcher. In thinking mode the grammar starts after the `</think>` token; before it every
token is allowed except `reasoning_refused` (e.g. `｜DSML｜`, or EOS while a call is
required). The engine asks once per step for the masks of a request's rows:

    c.row_masks(output_ids, drafts)  # [packed mask] for rows 0..m: row i follows drafts[:i]
    c.forced_rows                    # of that walk: the rows whose mask allowed one token

At K=0 (no drafts) that is one mask; at K=7 the matcher is advanced along the drafts,
filling a mask at each position, and stops after the first draft the grammar refuses (its
row's masked pick can never equal it, so nothing after it is accepted); the drafts are
rolled back afterwards, and the accepted tokens are taken in at the next ask.
NOTE: drafts are repaired in place (the tokens are still each row's own pick, K=7 == K=0;
only the acceptance grows): where a row's mask allows exactly one token (the schema's
skeleton: keys, quotes, brackets), that token replaces the draft, since the row's masked pick
can only be it; where the grammar refuses the draft and forces a string from here on
(xgrammar's jump-forward string, e.g. `", "age": `), the string's tokens (`encode`)
replace the drafts from there.
Masks are np.packbits(allowed, bitorder="little") bytes (protocol.TokenMask.bits): the
matcher's int32 bitmask words, little-endian, are exactly that layout.
"""

from __future__ import annotations

import numpy as np
import xgrammar as xg

from dspark_loop.contract.protocol import DSPARK_K, pack_mask, unpack_mask

MAX_ROLLBACK = 4 * (DSPARK_K + 1)  # a verify window's drafts, with room to spare
_batch: xg.BatchGrammarMatcher | None = None


def forced_token(words: np.ndarray) -> int | None:
    """The one id a bitmask row [words] int32 allows, or None (none or several)."""
    t = int(forced_tokens(words[None])[0])
    return t if t >= 0 else None


def forced_tokens(bitmask: np.ndarray) -> np.ndarray:
    """[n] int64: the one id each bitmask row [n, words] int32 allows, -1 where none or several."""
    out = np.full(len(bitmask), -1, np.int64)
    one_word = np.flatnonzero(np.count_nonzero(bitmask, axis=1) == 1)  # [m] rows with one nonzero word
    if not len(one_word):
        return out
    at = np.argmax(bitmask[one_word] != 0, axis=1)  # [m] that word's index
    w = bitmask[one_word, at].astype(np.int64) & 0xFFFFFFFF  # [m]
    single = (w & (w - 1)) == 0  # one bit set
    bit = np.log2(np.where(single, w, 1)).astype(np.int64)  # exact: w is a power of two
    out[one_word[single]] = at[single] * 32 + bit[single]
    return out


def _batch_matcher() -> xg.BatchGrammarMatcher:
    global _batch
    if _batch is None:
        _batch = xg.BatchGrammarMatcher(max_threads="auto")
    return _batch


class GrammarConstraint:
    def __init__(
        self,
        compiled: xg.CompiledGrammar,
        vocab_size: int,
        *,
        eos_id: int,
        think_end_id: int | None = None,
        reasoning_refused: tuple[int, ...] = (),
        encode=None,
    ):
        self._matcher = xg.GrammarMatcher(compiled, max_rollback_tokens=MAX_ROLLBACK)
        self.vocab_size = vocab_size
        self._nbytes = (vocab_size + 7) // 8
        self._think_end_id = think_end_id
        self._reasoning_refused = frozenset(reasoning_refused)
        reasoning = np.ones(vocab_size, dtype=bool)
        reasoning[list(self._reasoning_refused)] = False
        self._reasoning_bits = pack_mask(reasoning)
        only_eos = np.zeros(vocab_size, dtype=bool)
        only_eos[eos_id] = True
        self._eos_bits = pack_mask(only_eos)  # after EOS nothing may follow but padding
        self._all_bits = pack_mask(np.ones(vocab_size, dtype=bool))
        self._ids: list[int] = []  # every token taken in so far
        self._grammar_start = 0 if think_end_id is None else None  # index where the grammar began
        self._bitmask = np.zeros(xg.get_bitmask_shape(1, vocab_size), dtype=np.int32)  # [1, words]
        self._filled = False
        self._encode = encode  # text -> token ids (jump-forward drafts); None: off
        # the last walk's rows whose mask allowed one token only: that draft (repaired to it)
        # is accepted whenever the rows before it were
        self.forced_rows: list[int] = []

    # ---- what the engine asks ------------------------------------------------------------
    def row_masks(self, output_ids, drafts=()) -> list[bytes]:
        """Packed masks for rows 0..m (m <= len(drafts)): row i is what may follow
        output_ids + drafts[:i]; the list ends after the first refused draft. A draft
        whose row allows one token only becomes that token (drafts is a list, changed in
        place)."""
        self._sync(output_ids)
        base = len(self._ids)
        masks = []
        self.forced_rows = []
        for i in range(len(drafts) + 1):
            masks.append(self._packed())
            if i < len(drafts) and self._filled:
                forced = forced_token(self._bitmask[0])
                if forced is not None:
                    self.forced_rows.append(i)
                self._repair(drafts, i, self._bitmask[0], -1 if forced is None else forced)
            if i == len(drafts) or self.is_terminated() or not self.accept(int(drafts[i])):
                break
        self._truncate(base)
        return masks

    @staticmethod
    def batch_row_masks(constraints: list, outputs: list, drafts: list) -> list:
        """row_masks for many requests at once: per row index one batched fill over every
        matcher still in its window (xgrammar's threads, without the GIL). Per request its
        masks, or the exception its history raised (that request alone fails). Forced
        drafts are replaced in place, as in row_masks."""
        out: list = [[] for _ in constraints]
        live = []  # indices still in their window
        for j, (c, ids) in enumerate(zip(constraints, outputs)):
            try:
                c._sync(ids)
            except Exception as e:  # noqa: BLE001 -- one request's history
                out[j] = e
                continue
            c._base = len(c._ids)
            c.forced_rows = []
            live.append(j)
        words = xg.get_bitmask_shape(1, constraints[0].vocab_size)[1] if constraints else 0
        step = 0
        while live:
            fill = [j for j in live if constraints[j]._grammar_start is not None and not constraints[j].is_terminated()]
            if fill:
                bitmask = np.empty((len(fill), words), np.int32)  # [n, words]
                _batch_matcher().batch_fill_next_token_bitmask([constraints[j]._matcher for j in fill], bitmask)
                rows = bitmask.view(np.uint8)  # [n, 4 * words]
                forced = forced_tokens(bitmask).tolist()  # [n]
                for n, j in enumerate(fill):
                    out[j].append(rows[n, : constraints[j]._nbytes].tobytes())
                    if step < len(drafts[j]):
                        if forced[n] >= 0:
                            constraints[j].forced_rows.append(step)
                        constraints[j]._repair(drafts[j], step, bitmask[n], forced[n])
            filled = set(fill)
            nxt = []
            for j in live:
                c = constraints[j]
                if j not in filled:
                    out[j].append(c._packed())
                d = drafts[j]
                if step < len(d) and not c.is_terminated() and c.accept(int(d[step])):
                    nxt.append(j)
                else:
                    c._truncate(c._base)
            live = nxt
            step += 1
        return out

    def allowed_token_mask(self, output_ids) -> np.ndarray:
        """[vocab] bool: the tokens that may follow `output_ids`."""
        return unpack_mask(self.row_masks(output_ids)[0], 0, self.vocab_size)

    # ---- the matcher -----------------------------------------------------------------------
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

    def _repair(self, drafts: list, i: int, words: np.ndarray, forced: int) -> None:
        """Draft i (and maybe those after it) from what the grammar forces at row i, whose
        mask is `words` [words] int32 and whose one allowed id is `forced` (-1: none)."""
        if forced >= 0:
            drafts[i] = forced
            return
        d = int(drafts[i])
        if self._encode is None or (0 <= d < self.vocab_size and (int(words[d >> 5]) >> (d & 31)) & 1):
            return
        jump = self._matcher.find_jump_forward_string()
        if jump:
            ids = self._encode(jump)[: len(drafts) - i]
            drafts[i : i + len(ids)] = ids

    def _packed(self) -> bytes:
        self._filled = False  # whether self._bitmask holds this row's mask
        if self._grammar_start is None:
            return self._reasoning_bits
        if self._matcher.is_terminated():
            return self._eos_bits
        if not self._matcher.fill_next_token_bitmask(self._bitmask):
            return self._all_bits
        self._filled = True
        return self._bitmask.view(np.uint8)[0, : self._nbytes].tobytes()

    def _truncate(self, n: int) -> None:
        """Forget self._ids[n:] (the matcher rolls back the grammar's part of them)."""
        start = self._grammar_start
        if start is not None and len(self._ids) > max(n, start):
            self._matcher.rollback(len(self._ids) - max(n, start))
        if start is not None and n < start:  # back into the reasoning
            self._grammar_start = None
        del self._ids[n:]

    def _sync(self, output_ids) -> None:
        """Make the taken-in history equal `output_ids`."""
        ids = self._ids
        n = len(ids)
        if ids == list(output_ids[:n]):  # NOTE: the usual case, compared in C: the outputs went on
            common = n
        else:
            common = 0
            for a, b in zip(ids, output_ids):
                if a != b:
                    break
                common += 1
        if common < len(ids):
            start = self._grammar_start if self._grammar_start is not None else len(ids)
            if len(ids) - max(common, min(start, len(ids))) <= MAX_ROLLBACK:
                self._truncate(common)
            else:
                # NOTE: beyond the matcher's rollback window: replay from the start.
                self._matcher.reset()
                self._ids = []
                self._grammar_start = 0 if self._think_end_id is None else None
                common = 0
        for tid in list(output_ids[len(self._ids) :]):
            if not self.accept(int(tid)):
                raise ValueError(f"token {tid} breaks the output grammar")
