"""A scripted stand-in for the rank mesh: it mirrors block tables from the plans exactly as a
rank would, checks every write and read against them, and answers with a deterministic
"model": next = f(token at p, token at p-1 read back from the cache, p).

Cache slots hold content tags, not owner ids: position p's swa slot holds (p, token,
chain[p]) and compressed row j holds (j, chain at its boundary), where chain[p] =
hash(chain[p-1], token p) names the whole token prefix. A request admitted on a prefix hit
starts with no history: its chains are recovered from the swa slot just before its first
chunk (through `lineage`, every chain's parent), and then every compressed row it can
read and the whole window before that chunk must hold exactly its prefix's content.

A masked row (the plan's TokenMasks) answers its prediction if the mask allows it, else the
lowest id the mask allows (a masked argmax, deterministically).

Because reads go through the block table, a page that was released too early, mapped to
the wrong prefix, written while another request maps it, or never mapped makes the fake
raise (or the tokens change), so scheduler bugs cannot hide behind plausible output.
"""

from __future__ import annotations

import asyncio

import numpy as np

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.errors import EngineDead
from dspark_loop.contract.protocol import DSPARK_K, StepPlan, StepResult, as_i8, as_i32, unpack_mask
from dspark_testing.local_mesh import LocalMesh


class FakeRank:
    """One partition's TP leader: a runner (workers/runner_interface.py) without a model.
    draft_len: K=7, a drafter that proposes the model's own continuation of each anchor at
    P (with P + 8 <= draft_len, the context ceiling) with one planted error at index
    (P + req_id) % 8 (7: none); 0: no drafter."""

    num_blocks: list[int] = []  # the fake keeps no pools: the scheduler's are the truth

    def __init__(self, layout: CacheLayout, model, draft_len: int = 0):
        self.layout = layout
        self.model = model
        self.draft_len = draft_len
        self.drafts: tuple[list[int], np.ndarray] | None = None  # the last step's (req ids, [n, K])
        self.tables: dict[int, list[dict[int, int]]] = {}  # req_id -> family -> page -> block
        self.next_pos: dict[int, int] = {}  # req_id -> position after its committed rows
        self.store: list[dict[int, tuple]] = [{} for _ in layout.families]  # slot -> tag
        self.chains: dict[int, list[int]] = {}  # req_id -> chain per position [0, written)
        self.lineage: dict[int, int] = {}  # chain -> parent chain (0 before position 0)

    def execute(self, part) -> list[int]:
        for rid in part.freed_req_ids:
            assert rid in self.tables, f"freed unknown req {rid}"
            del self.tables[rid]
            self.next_pos.pop(rid, None)
            self.chains.pop(rid, None)
        for u in part.block_updates:
            table = self.tables.setdefault(u.req_id, [{} for _ in self.layout.families])[u.family]
            for k, b in enumerate(as_i32(u.block_ids)):
                page = u.first_page + k
                assert page not in table, f"req {u.req_id} family {u.family} page {page} remapped"
                table[page] = int(b)
        segments = []  # (req_id, start_pos, tokens, sampled rows)
        skip: set[int] = set()  # decode requests whose drafter pass the plan skips
        for c in part.prefills:
            toks = [int(t) for t in as_i32(c.token_ids)]
            segments.append((c.req_id, c.start_pos, toks, [len(toks) - 1] if c.sample else []))
        if part.decode is not None:
            d = part.decode
            rows, cu = as_i8(d.num_rows), 0
            all_toks = as_i32(d.token_ids)
            if d.draft_mask:
                skip = {int(r) for r, m in zip(as_i32(d.req_ids), d.draft_mask) if not m}
            for rid, start, k in zip(as_i32(d.req_ids), as_i32(d.start_pos), rows):
                toks = [int(t) for t in all_toks[cu : cu + k]]
                cu += k
                segments.append((int(rid), int(start), toks, list(range(k))))
        masks = {(m.req_id, m.row): m.bits for m in part.token_masks}
        live = self._live_owners()
        for rid, start, toks, _ in segments:  # write first, as the real ranks do
            self.next_pos[rid] = start  # reads of this step reach back from here
            self._write(rid, start, toks, live)
        out, anchors = [], []
        for rid, start, toks, sampled in segments:
            self._check_reads(rid, start)
            preds = []
            for k, i in enumerate(sampled):
                p = start + i
                prev = self._check_reads(rid, p)
                preds.append(masked_pick(self.model(toks[i], prev, p), masks.get((rid, k))))
            out += preds
            # NOTE: exact for prefill and 1-row decode; an upper bound for verify rows
            self.next_pos[rid] = start + len(toks)
            if preds and self.draft_len and rid not in skip:
                a = 1 if len(preds) == 1 else int(accept_chain(np.array([toks[1:]]), np.array([preds]))[0])
                end = start + len(toks) if len(preds) == 1 else start + a
                anchors.append((rid, end, preds[a - 1], toks[-1] if len(preds) == 1 else toks[a - 1]))
        if self.draft_len:
            self.drafts = self._propose(anchors)
        return out

    def _propose(self, anchors) -> tuple[list[int], np.ndarray]:
        """The drafts [n, K] of anchors (req_id, position P, token at P, token at P - 1)."""
        ids, rows = [], []
        for rid, pos, tok, prev in anchors:
            if pos + DSPARK_K + 1 > self.draft_len:
                continue
            chain = []
            for j in range(DSPARK_K):
                nxt = self.model(tok, prev, pos + j)
                chain.append(nxt if j != (pos + rid) % 8 else (nxt + 1) % 50 + 2)
                prev, tok = tok, chain[-1]
            ids.append(rid)
            rows.append(chain)
        return ids, np.array(rows, np.int32).reshape(len(ids), DSPARK_K)

    def take_drafts(self):
        """(req ids [n], drafts [n, K], confidences [n, K]) of the last step, or None."""
        if self.drafts is None:
            return None
        (ids, drafts), self.drafts = self.drafts, None
        return np.array(ids, np.int32), drafts, np.ones(drafts.shape, np.float32)

    def take_logprobs(self) -> None:
        return None

    def _slot(self, rid: int, fam, pos_or_row: int) -> tuple[int, int]:
        per = fam.rows_per_page
        page = pos_or_row // per
        table = self.tables.get(rid)
        assert table is not None, f"req {rid} has no block table"
        assert page in table[fam.index], f"req {rid} {fam.name} page {page} not mapped"
        block = table[fam.index][page]
        return block, block * per + pos_or_row % per

    def _history(self, rid: int, start: int) -> list[int]:
        """rid's chains for positions [0, start); recovered from the cache after a hit."""
        chains = self.chains.get(rid)
        if chains is not None and len(chains) >= start:
            del chains[start:]  # rejected verify rows are rewritten from here
            return chains
        assert chains is None, f"req {rid} skips positions {len(chains)}..{start - 1}"
        chains = []
        if start > 0:
            _, slot = self._slot(rid, self.layout.families[0], start - 1)
            tag = self.store[0].get(slot)
            assert tag is not None and tag[0] == start - 1, f"req {rid} hit at {start} finds {tag}"
            c = tag[2]
            while c:
                chains.append(c)
                c = self.lineage[c]
            chains.reverse()
            assert len(chains) == start, f"req {rid} hit at {start}: a prefix of {len(chains)}"
        self.chains[rid] = chains
        for fam in self.layout.families:  # a hit must bring every compressed row back
            for row in range(start // fam.ratio if fam.ratio else 0):
                self._check_row(rid, fam, row)
        return chains

    def _write(self, rid, start, toks, live) -> None:
        chains = self._history(rid, start)
        for i, t in enumerate(toks):
            p = start + i
            c = hash((chains[-1] if chains else 0, t))
            self.lineage[c] = chains[-1] if chains else 0
            chains.append(c)
            for fam in self.layout.families:
                if fam.ratio == 0:
                    key, tag = p, (p, t, c)
                elif (p + 1) % fam.ratio == 0:
                    key, tag = p // fam.ratio, (p // fam.ratio, c)
                else:
                    continue
                block, slot = self._slot(rid, fam, key)
                others = live[fam.index].get(block, set()) - {rid}
                assert not others, f"req {rid} writes {fam.name} block {block} live in reqs {others}"
                self.store[fam.index][slot] = tag

    def _check_row(self, rid: int, fam, row: int) -> None:
        _, slot = self._slot(rid, fam, row)
        want = (row, self.chains[rid][(row + 1) * fam.ratio - 1])
        got = self.store[fam.index].get(slot)
        assert got == want, f"req {rid} {fam.name} row {row} holds {got}, wants {want}"

    def _check_reads(self, rid: int, p: int) -> int:
        """What row p reads: the newest compressed rows and the window; returns token p-1."""
        for fam in self.layout.families:
            if fam.ratio and (p + 1) // fam.ratio > 0:
                self._check_row(rid, fam, (p + 1) // fam.ratio - 1)
        swa = self.layout.families[0]
        chains = self.chains[rid]
        tag = None
        for q in range(max(0, p - swa.window + 1), p):
            _, slot = self._slot(rid, swa, q)
            tag = self.store[0].get(slot)
            assert tag is not None and tag[0] == q and tag[2] == chains[q], f"req {rid} pos {q} holds {tag}"
        return tag[1] if p > 0 else -1

    def _live_owners(self) -> list[dict[int, set[int]]]:
        """family -> block -> the requests that may still read it (before this step)."""
        live: list[dict[int, set[int]]] = [{} for _ in self.layout.families]
        for fam in self.layout.families:
            for rid, table in self.tables.items():
                live_from = fam.first_live_page(self.next_pos.get(rid, 0)) if fam.ring else 0
                for page, block in table[fam.index].items():
                    if page >= live_from:
                        live[fam.index].setdefault(block, set()).add(rid)
        return live


def masked_pick(token: int, bits: bytes | None) -> int:
    """token if the mask (TokenMask.bits; None: no mask) allows it, else its lowest allowed id."""
    if bits is None:
        return token
    allowed = unpack_mask(bits, 0, 8 * len(bits))
    return token if token < len(allowed) and allowed[token] else int(allowed.argmax())


def default_model(allowed: list[int]):
    def model(tok: int, prev: int, pos: int) -> int:
        return allowed[(tok * 31 + (prev + 1) * 17 + pos * 7) % len(allowed)]

    return model


class FakeMesh(LocalMesh):
    """`step(plan)` as the real mesh: one leader StepResult per partition, from FakeRanks."""

    def __init__(self, layout: CacheLayout, num_partitions: int, allowed: list[int], script=None, draft_len: int = 0):
        base = default_model(allowed)
        self.script = script  # script(tok, prev, pos) -> token or None (use the model)

        def model(tok, prev, pos):
            forced = self.script(tok, prev, pos) if self.script else None
            return base(tok, prev, pos) if forced is None else forced

        super().__init__([FakeRank(layout, model, draft_len) for _ in range(num_partitions)])
        self.fail_at_step: int | None = None  # raise EngineDead on this step id
        self.delay_s = 0.0
        self.plans: list[StepPlan] = []

    def run(self, plan: StepPlan) -> list[StepResult]:
        self.plans.append(plan)
        return super().run(plan)

    async def step(self, plan: StepPlan) -> list[StepResult]:
        if self.fail_at_step is not None and plan.step_id >= self.fail_at_step:
            self.dead = "rank 0 stopped answering"
            raise EngineDead(self.dead)
        await asyncio.sleep(self.delay_s)
        return self.run(plan)
