"""A scripted stand-in for the rank mesh: it mirrors block tables from the plans exactly as a
rank would, checks every write and read against them, and answers with a deterministic
"model": next = f(token at p, token at p-1 read back from the cache, p).

Because the previous token is read through the block table, a page that was released too
early, mapped to two live requests, or never mapped makes the fake raise (or the tokens
change), so scheduler bugs cannot hide behind plausible output.
"""
from __future__ import annotations

import asyncio

from dspark_loop.cache_layout import CacheLayout
from dspark_loop.errors import EngineDead
from dspark_loop.protocol import StepPlan, StepResult, as_i8, as_i32, i32


class FakeRank:
    """One partition's TP leader."""

    def __init__(self, layout: CacheLayout, model):
        self.layout = layout
        self.model = model
        self.tables: dict[int, list[dict[int, int]]] = {}  # req_id -> family -> page -> block
        self.next_pos: dict[int, int] = {}  # req_id -> position after its committed rows
        self.store: list[dict[int, tuple]] = [{} for _ in layout.families]  # slot -> tag

    def run(self, part) -> list[int]:
        for rid in part.freed_req_ids:
            assert rid in self.tables, f"freed unknown req {rid}"
            del self.tables[rid]
            self.next_pos.pop(rid, None)
        for u in part.block_updates:
            table = self.tables.setdefault(u.req_id, [{} for _ in self.layout.families])[u.family]
            for k, b in enumerate(as_i32(u.block_ids)):
                page = u.first_page + k
                assert page not in table, f"req {u.req_id} family {u.family} page {page} remapped"
                table[page] = int(b)
        segments = []  # (req_id, start_pos, tokens, sampled rows)
        for c in part.prefills:
            toks = [int(t) for t in as_i32(c.token_ids)]
            segments.append((c.req_id, c.start_pos, toks, [len(toks) - 1] if c.sample else []))
        if part.decode is not None:
            d = part.decode
            rows, cu = as_i8(d.num_rows), 0
            all_toks = as_i32(d.token_ids)
            for rid, start, k in zip(as_i32(d.req_ids), as_i32(d.start_pos), rows):
                toks = [int(t) for t in all_toks[cu:cu + k]]
                cu += k
                segments.append((int(rid), int(start), toks, list(range(k))))
        written: list[dict[int, int]] = [{} for _ in self.layout.families]  # block -> req
        for rid, start, toks, _ in segments:  # write first, as the real ranks do
            self.next_pos[rid] = start  # reads of this step reach back from here
            self._write(rid, start, toks, written)
        self._check_no_shared_live_pages()
        out = []
        for rid, start, toks, sampled in segments:
            for i in sampled:
                p = start + i
                prev = self._read_prev(rid, p)
                out.append(self.model(toks[i], prev, p))
            # NOTE: exact for prefill and 1-row decode; an upper bound for verify rows
            self.next_pos[rid] = start + len(toks)
        return out

    def _slot(self, rid: int, fam, pos_or_row: int) -> tuple[int, int]:
        per = fam.rows_per_page
        page = pos_or_row // per
        table = self.tables.get(rid)
        assert table is not None, f"req {rid} has no block table"
        assert page in table[fam.index], f"req {rid} {fam.name} page {page} not mapped"
        block = table[fam.index][page]
        return block, block * per + pos_or_row % per

    def _write(self, rid, start, toks, written) -> None:
        for i, t in enumerate(toks):
            p = start + i
            for fam in self.layout.families:
                if fam.ratio == 0:
                    key, tag = p, (rid, p, t)
                elif (p + 1) % fam.ratio == 0:
                    key, tag = p // fam.ratio, (rid, p // fam.ratio)
                else:
                    continue
                block, slot = self._slot(rid, fam, key)
                owner = written[fam.index].setdefault(block, rid)
                assert owner == rid, f"{fam.name} block {block} written by reqs {owner} and {rid}"
                self.store[fam.index][slot] = tag

    def _read_prev(self, rid: int, p: int) -> int:
        for fam in self.layout.families:  # the newest compressed row must be intact too
            if fam.ratio and (p + 1) // fam.ratio > 0:
                row = (p + 1) // fam.ratio - 1
                _, slot = self._slot(rid, fam, row)
                assert self.store[fam.index].get(slot) == (rid, row), \
                    f"req {rid} {fam.name} row {row} holds {self.store[fam.index].get(slot)}"
        if p == 0:
            return -1
        swa = self.layout.families[0]
        _, slot = self._slot(rid, swa, p - 1)
        tag = self.store[0].get(slot)
        assert tag is not None and tag[:2] == (rid, p - 1), f"req {rid} pos {p - 1} holds {tag}"
        return tag[2]

    def _check_no_shared_live_pages(self) -> None:
        for fam in self.layout.families:
            owner: dict[int, int] = {}
            for rid, table in self.tables.items():
                live_from = fam.first_live_page(self.next_pos.get(rid, 0)) if fam.ring else 0
                for page, block in table[fam.index].items():
                    if page >= live_from:
                        other = owner.setdefault(block, rid)
                        assert other == rid, f"{fam.name} block {block} live in reqs {other} and {rid}"


def default_model(allowed: list[int]):
    def model(tok: int, prev: int, pos: int) -> int:
        return allowed[(tok * 31 + (prev + 1) * 17 + pos * 7) % len(allowed)]
    return model


class FakeMesh:
    """`step(plan)` as the real mesh: one leader StepResult per partition."""

    def __init__(self, layout: CacheLayout, num_partitions: int, allowed: list[int], script=None):
        base = default_model(allowed)
        self.script = script  # script(tok, prev, pos) -> token or None (use the model)

        def model(tok, prev, pos):
            forced = self.script(tok, prev, pos) if self.script else None
            return base(tok, prev, pos) if forced is None else forced

        self.ranks = [FakeRank(layout, model) for _ in range(num_partitions)]
        self.dead: str | None = None
        self.fail_at_step: int | None = None  # raise EngineDead on this step id
        self.delay_s = 0.0
        self.plans: list[StepPlan] = []

    def run(self, plan: StepPlan) -> list[StepResult]:
        self.plans.append(plan)
        assert len(plan.partitions) == len(self.ranks)
        return [StepResult(plan.step_id, p, i32(rank.run(part)))
                for p, (rank, part) in enumerate(zip(self.ranks, plan.partitions))]

    async def step(self, plan: StepPlan) -> list[StepResult]:
        if self.fail_at_step is not None and plan.step_id >= self.fail_at_step:
            self.dead = "rank 0 stopped answering"
            raise EngineDead(self.dead)
        await asyncio.sleep(self.delay_s)
        return self.run(plan)
