"""tools.bench.host --constrained N: JSON-schema requests at a production-sized vocab.

A synthetic byte vocab of VOCAB ids (0 pad, 1 EOS, 2..257 the single bytes, then pieces
shaped like BPE's: 90% letter runs of 2-8 with an optional leading space, 5% digit runs,
5% short punctuation runs) stands in for DeepSeek's 129,280 (a mask fill costs what the
vocab and the share of pieces holding quotes or brackets make it cost).
Every constrained request gets a GrammarConstraint over SCHEMA. The instant mesh keeps a
shadow constraint per constrained request: its rows pick, among the ids their plan mask
allows, the one nearest the scripted prediction, and at K=7 it drafts grammar-valid tokens
the same way, right for `num_right` positions (then a refused id), so the host fills up to
8 masks per request per step as it would for a good drafter.
"""

from __future__ import annotations

import numpy as np
import xgrammar as xg

from dspark_loop.api.structured.grammar_constraint import GrammarConstraint
from dspark_loop.contract.protocol import DSPARK_K, unpack_mask

VOCAB = 129_280
EOS = 1
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "maxLength": 40},
        "kind": {"enum": ["alpha", "beta", "gamma", "delta"]},
        "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 8},
        "owner": {
            "type": "object",
            "properties": {"email": {"type": "string", "format": "email"}, "vip": {"type": "boolean"}},
            "required": ["email", "vip"],
        },
    },
    "required": ["id", "name", "kind", "scores", "owner"],
}
_compiled = None


def compiled_schema() -> xg.CompiledGrammar:
    global _compiled
    if _compiled is None:
        rng = np.random.default_rng(0)
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", np.uint8)
        digits = np.frombuffer(b"0123456789", np.uint8)
        punct = np.frombuffer(b" _-.,:;{}[]()\"'@/\n", np.uint8)
        pieces = [b"<pad>", b"<eos>"] + [bytes([b]) for b in range(256)]
        seen = set(pieces)
        while len(pieces) < VOCAB:
            kind = rng.random()
            if kind < 0.9:
                piece = (b" " if rng.random() < 0.5 else b"") + bytes(
                    rng.choice(letters, int(rng.integers(2, 9))).tolist()
                )
            elif kind < 0.95:
                piece = bytes(rng.choice(digits, int(rng.integers(2, 5))).tolist())
            else:
                piece = bytes(rng.choice(punct, int(rng.integers(2, 4))).tolist())
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)
        info = xg.TokenizerInfo(pieces, xg.VocabType.RAW, vocab_size=VOCAB, stop_token_ids=[EOS])
        _compiled = xg.GrammarCompiler(info, max_threads=1).compile_json_schema(SCHEMA, any_whitespace=False)
    return _compiled


def new_constraint() -> GrammarConstraint:
    return GrammarConstraint(compiled_schema(), VOCAB, eos_id=EOS)


def nearest_allowed(allowed: np.ndarray, want: int) -> int:
    ids = np.flatnonzero(allowed)
    return int(ids[min(np.searchsorted(ids, want), len(ids) - 1)])


class Shadows:
    """The mesh's view of each constrained request: its outputs and a shadow grammar."""

    def __init__(self) -> None:
        self.outputs: dict[int, list[int]] = {}
        self.grammar: dict[int, GrammarConstraint] = {}

    def masked_rows(self, part, num_rows_before: dict[int, int], preds: np.ndarray) -> None:
        """Replace each masked row's prediction by its nearest allowed id (in place)."""
        for m in part.token_masks:
            row = num_rows_before[m.req_id] + m.row
            preds[row] = nearest_allowed(unpack_mask(m.bits, 0, VOCAB), int(preds[row]))

    def accepted(self, req_id: int, tokens) -> None:
        """NOTE: the engine ends a request at its EOS; the tokens after it are not outputs."""
        out = self.outputs.get(req_id)
        if out is None or (out and out[-1] == EOS):
            return
        for t in tokens:
            out.append(int(t))
            if t == EOS:
                break

    def drafts(self, req_id: int, num_right: int, predict) -> np.ndarray:
        """7 grammar-valid drafts after the request's outputs, right for num_right."""
        out = np.zeros(DSPARK_K, np.int32)  # id 0 (pad) is never allowed: a refused draft
        ids = self.outputs[req_id]
        if ids and ids[-1] == EOS:  # finished: the engine asks nothing more
            return out
        g = self.grammar[req_id]
        prev = ids[-1]
        walk = []
        for j in range(min(num_right, DSPARK_K)):
            allowed = unpack_mask(g.row_masks(ids + walk)[0], 0, VOCAB)
            if not allowed[2:].any():
                break
            prev = nearest_allowed(allowed, int(predict(np.array([prev]))[0]))
            walk.append(prev)
            out[j] = prev
            if prev == EOS:
                break
        return out
