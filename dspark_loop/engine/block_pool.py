"""One cache family's blocks in one partition: allocation, reference counts and prefix keys.

Prefix caching (prefix_cache.py) shares full pages: a block has one reference per request
that maps it. A block whose ref count drops to 0 goes to the free list, or, if it holds a
registered prefix page (it has a key), to the pool's LRU, where it stays hittable until an
allocation finds the free list empty and evicts it (dropping its key).

    block states:  free (ref 0, no key)  <-- allocate/free -->  owned (ref >= 1, key or not)
                   lru  (ref 0, key)     <-- touch/free   -->   owned
                   lru  -- allocate (evict, key dropped) -->    owned
"""

from __future__ import annotations

from collections import OrderedDict, deque


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # NOTE: FIFO free list: freed blocks go to the back, so a block just released is
        # the last to be reused (deterministic ids).
        self._free: deque[int] = deque(range(num_blocks))
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, ref 0; oldest first
        self.key_to_block: dict[int, int] = {}
        self.block_to_key: dict[int, int] = {}
        self.num_evicted = 0

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: truly free plus evictable cached ones."""
        return len(self._free) + len(self._lru)

    def can_allocate(self, num: int) -> bool:
        return num <= self.num_free

    def allocate(self, num: int) -> list[int]:
        if num == 1 and self._free:  # the common case: one page off the free list
            b = self._free.popleft()
            self.ref_counts[b] = 1
            return [b]
        if num > self.num_free:
            raise RuntimeError(f"pool exhausted: want {num}, {self.num_free} free")
        ids = []
        for _ in range(num):
            if self._free:
                b = self._free.popleft()
            else:  # evict the least recently released cached page
                b, _ = self._lru.popitem(last=False)
                del self.key_to_block[self.block_to_key.pop(b)]
                self.num_evicted += 1
            self.ref_counts[b] = 1
            ids.append(b)
        return ids

    def free(self, block_ids) -> None:
        cached = []
        for b in block_ids:
            n = self.ref_counts[b] - 1
            if n < 0:
                raise RuntimeError(f"block {b} freed twice")
            self.ref_counts[b] = n
            if n == 0:
                if b in self.block_to_key:
                    cached.append(b)
                else:
                    self._free.append(b)
        # NOTE: a request's pages are freed head first; they enter the LRU tail first, so
        # eviction eats a prefix from its end and the head (shared by most prompts) lives on.
        for b in reversed(cached):
            self._lru[b] = None

    def free_ids(self) -> list[int]:
        return list(self._free)

    def lru_ids(self) -> list[int]:
        """Cached blocks nobody maps, next to be evicted first."""
        return list(self._lru)

    # ---- prefix keys --------------------------------------------------------------------
    def lookup(self, key: int) -> int | None:
        return self.key_to_block.get(key)

    def register(self, block: int, key: int) -> bool:
        """Give an owned, full block its prefix key; False if the key is taken already."""
        if key in self.key_to_block or block in self.block_to_key:
            return False
        self.key_to_block[key] = block
        self.block_to_key[block] = key
        return True

    def touch(self, block_ids) -> None:
        """Take one more reference on cached blocks (a prefix hit)."""
        for b in block_ids:
            if self.ref_counts[b] == 0:
                del self._lru[b]  # KeyError: a hit on an unregistered free block is a bug
            self.ref_counts[b] += 1

    def num_unowned(self, block_ids) -> int:
        """How many of these blocks sit in the LRU (touching them uses up free capacity)."""
        return sum(1 for b in block_ids if self.ref_counts[b] == 0)

    def check_integrity(self, f: int, refs: list[int]) -> None:
        free, lru = self.free_ids(), self.lru_ids()
        if len(set(free)) != len(free):
            raise AssertionError(f"family {f}: duplicate ids in the free list")
        if set(free) & set(lru):
            raise AssertionError(f"family {f}: blocks both free and in the LRU")
        for b in free + lru:
            if refs[b]:
                raise AssertionError(f"family {f}: block {b} is free and owned")
        for b in free:
            if b in self.block_to_key:
                raise AssertionError(f"family {f}: free block {b} still has a prefix key")
        for b in lru:
            if b not in self.block_to_key:
                raise AssertionError(f"family {f}: LRU block {b} has no prefix key")
        if any(self.key_to_block.get(k) != b for b, k in self.block_to_key.items()) or len(self.key_to_block) != len(
            self.block_to_key
        ):
            raise AssertionError(f"family {f}: prefix key maps disagree")
        if refs != self.ref_counts:
            bad = [b for b in range(self.num_blocks) if refs[b] != self.ref_counts[b]]
            raise AssertionError(f"family {f}: ref counts disagree at blocks {bad[:8]}")
        if len(free) + len(lru) + sum(1 for r in refs if r) != self.num_blocks:
            raise AssertionError(f"family {f}: leaked blocks")
