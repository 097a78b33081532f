"""Prefix caching: chained hashes of full pages, the hit lookup, registration of pages.

Tokens are hashed in chunks of g = gcd(page capacities) tokens (32 for Flash), each hash
chained on the previous one, so hashes[k] stands for the whole prefix tokens[0 : (k+1)*g]:

    tokens  |-- g --|-- g --|-- g --|-- g --|-- g --|-- g --|-- g --|-- g --|
    hashes     h0      h1      h2      h3      h4      h5      h6      h7
    swa     [ page 0][ page 1][ page 2][ page 3][ page 4] ...    (g tokens a page)
    c4      [            page 0 (key h3)       ][            page 1 (key h7)       ]

The key of page n in a family is the hash of the prefix up to the page's end, so equal
keys mean equal contents in every family (raw KV, compressor states, compressed rows and
indexer keys are all functions of the prefix). Each family's pool maps key -> block.

A hit of h tokens needs every c{r} page below h and only the swa ring pages a step
writing from h still reads, [first_live_page(h), h / block_size); the request then
prefills from num_computed = h. h is a multiple of CacheLayout.prefix_align (the LCM of
page capacities), so no page is half shared and writes never touch a shared page.

NOTE: h <= num_tokens - max(1, replay). The chunk that reaches the prompt's end must
sample a token (replay >= 1), and at K=7 the drafter re-seeds from the last 128 prefilled
rows (dspark.md), so replay = 128 there. The first possible hit therefore needs
prefix_align + max(1, replay) tokens: 129 at K=0 and 256 at K=7 with Flash's 128-token
alignment; 17 and 144 with the tests' tiny layout (4-token swa pages, c4 pages of 16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from hashlib import blake2b

from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.engine.kv_cache import FamilyPages, PartitionCache
from dspark_loop.engine.request import NEVER, Request

DRAFTER_REPLAY = 128  # rows the K=7 drafter re-reads from prefill to seed its rings


@dataclass
class PrefixHit:
    num_tokens: int  # h
    pages: list[FamilyPages]  # per family: the cached pages to share (not yet referenced)


class PrefixCache:
    def __init__(self, layout: CacheLayout, spec_k: int):
        self.families = layout.families
        self.align = layout.prefix_align
        self.chunk = math.gcd(*(f.tokens_per_page for f in self.families))
        self.replay = DRAFTER_REPLAY if spec_k else 1

    def max_hit(self, num_tokens: int) -> int:
        return max(0, num_tokens - self.replay) // self.align * self.align

    def hashes(self, req: Request, num_tokens: int) -> list[int]:
        """req's chained chunk hashes, extended to cover tokens[0 : num_tokens]."""
        hashes = req.prefix_hashes
        g, have, want = self.chunk, len(req.prefix_hashes), num_tokens // self.chunk
        if want > have:
            data = req.token_bytes(have * g, want * g)  # [(want - have) * g] int32
            span = 4 * g
            parent = hashes[-1] if hashes else 0
            for i in range(want - have):
                d = blake2b(parent.to_bytes(8, "little"), digest_size=8)
                d.update(data[i * span : (i + 1) * span])
                parent = int.from_bytes(d.digest(), "little")
                hashes.append(parent)
        return hashes

    def _key(self, hashes: list[int], page_end: int) -> int:
        return hashes[page_end // self.chunk - 1]

    # ---- lookup -------------------------------------------------------------------------
    def find(self, cache: PartitionCache, req: Request) -> PrefixHit | None:
        """The longest hit for req's tokens in one partition, or None."""
        limit = self.max_hit(req.num_tokens)
        if limit == 0:
            return None
        hashes = self.hashes(req, limit)
        for f, fam in enumerate(self.families):  # full history: a run of pages from page 0
            if fam.ring:
                continue
            tpp, pool, n = fam.tokens_per_page, cache.pools[f], 0
            while (n + 1) * tpp <= limit and pool.lookup(self._key(hashes, (n + 1) * tpp)) is not None:
                n += 1
            limit = n * tpp // self.align * self.align
            if limit == 0:
                return None
        # NOTE: a ring's tail at a shorter h may survive when a longer one was evicted.
        for h in range(limit, 0, -self.align):
            pages = self._pages_at(cache, hashes, h)
            if pages is not None:
                return PrefixHit(h, pages)
        return None

    def hit_len(self, cache: PartitionCache, req: Request) -> int:
        hit = self.find(cache, req)
        return 0 if hit is None else hit.num_tokens

    def _pages_at(self, cache: PartitionCache, hashes: list[int], h: int) -> list[FamilyPages] | None:
        out = []
        for f, fam in enumerate(self.families):
            tpp, pool = fam.tokens_per_page, cache.pools[f]
            fp = FamilyPages()
            fp.first_page = fam.first_live_page(h) if fam.ring else 0
            for n in range(fp.first_page, h // tpp):
                b = pool.lookup(self._key(hashes, (n + 1) * tpp))
                if b is None:
                    return None
                fp.block_ids.append(b)
            out.append(fp)
        return out

    # ---- registration -------------------------------------------------------------------
    def start(self, req: Request, num_computed: int) -> None:
        """req was admitted with positions < num_computed already cached (a hit or 0)."""
        req.registered_len = num_computed
        req.register_pos = self._next_aligned(num_computed)

    def register(self, cache: PartitionCache, req: Request) -> None:
        """Key every page below the last aligned position reached since the last call (call
        when num_computed >= req.register_pos). Only committed positions count: K=7 verify
        rows past num_computed are written eagerly but may be rejected and rewritten.
        NOTE: per prefix_align, not per page: a hit's length is a multiple of the alignment
        and needs no page past it, so pages are keyed in batches (Flash: the 4 swa pages and
        the c4 and c128 pages of each 128 tokens in one call, not one call per 32)."""
        a = self.align
        end = min(req.num_computed, req.num_tokens) // a * a
        done = req.registered_len
        if end > done:
            hashes = self.hashes(req, end)
            for f, fam in enumerate(self.families):
                tpp, fp, pool = fam.tokens_per_page, req.pages[f], cache.pools[f]
                # pages wholly inside (done, end]; ring pages already released are gone
                for n in range(max(done // tpp, fp.first_page), end // tpp):
                    pool.register(fp.block_ids[n - fp.first_page], self._key(hashes, (n + 1) * tpp))
            req.registered_len = end
        req.register_pos = self._next_aligned(req.registered_len)

    def _next_aligned(self, pos: int) -> int:
        """The next aligned position: where register() has new pages to key."""
        return (pos // self.align + 1) * self.align


def stop_registering(req: Request) -> None:
    """req lost its pages (preemption): nothing to register until it is admitted again."""
    req.registered_len = 0
    req.register_pos = NEVER
