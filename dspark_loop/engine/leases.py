"""Drafter leases (K=7): one stable group-local id per running request, naming the
request's drafter rings on the ranks (runner-private, never scheduler-visible).

    lease l -> ring blocks l*6 .. l*6+5 per draft stage on every rank of the group

Taken when a request is admitted, freed on completion, abort and preemption. A request
that comes back after a preemption gets a fresh lease and the plan asks the ranks to
scrub it (zero its blocks) first: its new incarnation must never read the old one's rows.
"""

from __future__ import annotations


class LeasePool:
    def __init__(self, num_leases: int) -> None:
        if num_leases < 1:
            raise ValueError(f"num_leases must be positive, got {num_leases}")
        self.num_leases = num_leases
        self._free = list(range(num_leases - 1, -1, -1))  # pop() gives the lowest id first
        self._owner: dict[int, int] = {}  # lease -> req_id

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_in_use(self) -> int:
        return len(self._owner)

    def take(self, req_id: int) -> int:
        if not self._free:
            raise RuntimeError(f"no free drafter lease ({self.num_leases} in use)")
        lease = self._free.pop()
        self._owner[lease] = req_id
        return lease

    def free(self, lease: int) -> None:
        if self._owner.pop(lease, None) is None:
            raise AssertionError(f"lease {lease} freed twice")
        self._free.append(lease)

    def owner(self, lease: int) -> int | None:
        return self._owner.get(lease)

    def check_integrity(self, held: dict[int, int]) -> None:
        """held: lease -> req_id of every running request; all others must be free."""
        if held != self._owner:
            raise AssertionError(f"leases in use {self._owner} != held by running requests {held}")
        if len(set(self._free)) != len(self._free) or set(self._free) & set(self._owner):
            raise AssertionError("lease free list corrupt")
