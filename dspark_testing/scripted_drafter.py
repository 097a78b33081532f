"""A scripted drafter for tests (K=7): it knows each prompt's true greedy continuation and is
wrong on purpose at one draft index, so every verify accepts exactly a chosen length.

A Proposer (workers/proposer.py), handed to the runner by the test: ModelRunner(proposer=...)
in one process, or through the test runner scripted_drafter_runner.py (DSPARK_TEST_RUNNER,
with DSPARK_TEST_DRAFTER=/path/spec.json) in a served test; the product never imports it.
The spec:

    {"cases": [{"prompt": [ids], "reference": [ids], "error_at": m}, ...]}

reference = the K=0 greedy output the test computed; m in 0..7 (7 = never wrong). At an
anchor at position L it proposes seq[L+1 .. L+7] (seq = prompt + reference) with the token
at index m replaced by a different one, so a verify accepts m+1 tokens (until the end).
"""

from __future__ import annotations

import json

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K, PrefillChunk, as_i32


class ScriptedDrafter:
    def __init__(self, spec: dict | str, vocab_size: int, noise_token_id: int = 0) -> None:
        if isinstance(spec, str):
            with open(spec, encoding="utf-8") as f:
                spec = json.load(f)
        self.cases = [
            (np.asarray(list(c["prompt"]) + list(c["reference"]), np.int64), int(c["error_at"])) for c in spec["cases"]
        ]
        for _, m in self.cases:
            if not 0 <= m <= DSPARK_K:
                raise ValueError(f"error_at must be in 0..{DSPARK_K}, got {m}")
        self.vocab_size, self.noise = vocab_size, noise_token_id
        self.case_of: dict[int, int] = {}  # req_id -> case index (-1: no case matches)

    tap_layers: tuple[int, ...] = ()  # reads no hidden rows

    def observe(self, chunk: PrefillChunk) -> None:
        """A prefill chunk's tokens: the first chunk of a request picks its case."""
        req_id, start_pos, token_ids = chunk.req_id, chunk.start_pos, as_i32(chunk.token_ids)
        if req_id in self.case_of:
            return
        n = len(token_ids)
        self.case_of[req_id] = next(
            (
                i
                for i, (seq, _) in enumerate(self.cases)
                if len(seq) >= start_pos + n and np.array_equal(seq[start_pos : start_pos + n], token_ids)
            ),
            -1,
        )

    def forget(self, req_id: int) -> None:
        self.case_of.pop(req_id, None)

    def scrub(self, lease: int) -> None:
        pass  # keeps no per-lease state

    def propose(self, b, leases, out, comm, sampler=None) -> tuple[np.ndarray, np.ndarray]:
        """b: the step's DraftBatch (its anchors; context rows are not needed) -> drafts
        int32 [R, 7], confidence float32 [R, 7] (1 up to the planted error, then 0)."""
        req_ids, anchor_pos = b.q_req, b.q_pos
        drafts = np.full((len(req_ids), DSPARK_K), self.noise, np.int32)
        conf = np.zeros((len(req_ids), DSPARK_K), np.float32)
        for r, (req, pos) in enumerate(zip(req_ids, anchor_pos)):
            case = self.case_of.get(req, -1)
            if case < 0:
                continue
            seq, m = self.cases[case]
            truth = seq[pos + 1 : pos + 1 + DSPARK_K]
            drafts[r, : len(truth)] = truth
            if m < DSPARK_K:
                drafts[r, m] = (drafts[r, m] + 1) % self.vocab_size
            conf[r, :m] = 1.0
        return drafts, conf
