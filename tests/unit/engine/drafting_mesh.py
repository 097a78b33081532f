"""A FakeMesh whose leaders also draft (K=7), as the ranks do: after each step, an anchor per
prompt that completed (its sampled token) and per decode request (the last accepted
token, unless the plan's draft_mask skips it or its 8-row window passes the ceiling), in
plan order; the drafts are the fake model's own continuation, wrong from a random index on,
with random confidences. The rank's rule for the accepted length is the shared accept_chain.
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.protocol import DSPARK_K, StepPlan, StepResult, as_i8, as_i32, f32, i32
from tests.unit.engine.fake_mesh import FakeMesh


class DraftingMesh(FakeMesh):
    def __init__(self, layout, num_partitions, allowed, max_model_len: int, seed: int = 0, script=None):
        super().__init__(layout, num_partitions, allowed, script)
        self.max_model_len = max_model_len
        self.rng = np.random.default_rng(seed)
        self.allowed = allowed
        self.sent_conf: dict[int, np.ndarray] = {}  # wire req id -> the last confidences sent [K]

    def run(self, plan: StepPlan) -> list[StepResult]:
        results = super().run(plan)
        ranks = self.runners  # FakeRanks (runners over a LocalMesh)
        for res, rank, part in zip(results, ranks, plan.partitions):
            anchors = self._anchors(part, as_i32(res.token_ids))  # (req_id, pos, token, prev token)
            if not anchors:
                continue
            drafts = np.empty((len(anchors), DSPARK_K), np.int32)  # [n, K]
            for j, (_, pos, tok, prev) in enumerate(anchors):
                wrong_from = int(self.rng.integers(0, DSPARK_K + 1))
                for s in range(DSPARK_K):
                    nxt = rank.model(tok, prev, pos + s)
                    if s >= wrong_from:
                        nxt = self.allowed[(self.allowed.index(nxt) + 1) % len(self.allowed)]
                    drafts[j, s], prev, tok = nxt, tok, nxt
            conf = self.rng.random((len(anchors), DSPARK_K), np.float32)  # [n, K]
            ids = [a[0] for a in anchors]
            self.sent_conf.update(zip(ids, conf))
            res.draft_req_ids, res.draft_token_ids, res.draft_confidence = i32(ids), i32(drafts), f32(conf)
        return results

    def _anchors(self, part, tokens: np.ndarray) -> list[tuple[int, int, int, int]]:
        out, i = [], 0
        for c in part.prefills:
            if c.sample:
                toks = as_i32(c.token_ids)
                if c.draft:
                    out.append((c.req_id, c.start_pos + len(toks), int(tokens[i]), int(toks[-1])))
                i += 1
        d = part.decode
        if d is None:
            return [a for a in out if a[1] + DSPARK_K + 1 <= self.max_model_len]
        rows, inputs = as_i8(d.num_rows), as_i32(d.token_ids)
        mask = np.frombuffer(d.draft_mask, np.uint8) if d.draft_mask else np.ones(len(rows), np.uint8)
        cu = 0
        for rid, start, k, m in zip(as_i32(d.req_ids).tolist(), as_i32(d.start_pos).tolist(), rows.tolist(), mask):
            preds = tokens[i + cu : i + cu + k]
            drafts = np.zeros((1, DSPARK_K), np.int64)
            drafts[0, : k - 1] = inputs[cu + 1 : cu + k]
            full = np.zeros((1, DSPARK_K + 1), np.int64)
            full[0, :k] = preds
            a = int(accept_chain(drafts, full, np.array([k - 1]))[0])
            if m:
                out.append((rid, start + a, int(preds[a - 1]), int(inputs[cu + a - 1])))
            cu += k
        return [a for a in out if a[1] + DSPARK_K + 1 <= self.max_model_len]
