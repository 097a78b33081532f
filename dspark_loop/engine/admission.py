"""Admission: which partition a new request waits in, and which waiting requests start
running this step (prefix hit, first chunk, pages, wire id, lease). A manager of the
Scheduler: it decides; the Partition's transitions (admit, allocate, end) change the
requests' state.
"""

from __future__ import annotations

from dspark_loop.contract.protocol import BlockUpdate, i32
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.prefix_cache import PrefixCache
from dspark_loop.engine.request import Request
from dspark_loop.engine.sampling_wire import sampling_spec
from dspark_loop.engine.spec_counters import SpecCounters


class Admission:
    def __init__(self, prefix: PrefixCache | None, chunk_cap: int, max_seqs_per_partition: int, spec: SpecCounters):
        self.prefix, self.chunk_cap = prefix, chunk_cap
        self.max_seqs_per_partition = max_seqs_per_partition
        self.spec = spec
        self._next_req_id = 0

    def place(self, partitions: list[Partition], req: Request) -> Partition:
        # NOTE: the longest prefix hit picks the partition (its pages live there only);
        # ties and misses go to the partition with the fewest requests.
        prefix = self.prefix
        if prefix is None:
            return min(partitions, key=lambda p: (p.num_requests, p.index))
        return min(partitions, key=lambda p: (-prefix.hit_len(p.cache, req), p.num_requests, p.index))

    def admit(self, part: Partition, budget: int, prefills: list, updates: list) -> list[tuple[Request, str]]:
        """Admit from the queue head while budget, seats and pages allow; returns the
        requests that can never run, with why: they have ended (Partition.end), the
        Scheduler reports the error."""
        cache = part.cache
        failed: list[tuple[Request, str]] = []
        while part.waiting and budget > 0 and len(part.running) < self.max_seqs_per_partition:
            req = part.waiting[0]
            # NOTE: prompt logprobs need every prompt row's logits: a cached head has none
            prefix = self.prefix if req.params.prompt_logprobs < 0 else None
            hit = prefix.find(cache, req) if prefix is not None else None
            start = hit.num_tokens if hit else 0
            n = min(req.num_tokens - start, self.chunk_cap, budget)
            req.pages = hit.pages if hit else cache.new_pages()
            counts = cache.num_new_pages(req.pages, start + n)
            if not cache.can_allocate(counts, req.pages if hit else None):
                req.pages = []
                if part.running:
                    return failed  # wait for pages to come back
                # NOTE: alone in an empty partition and still no room: it can never run.
                message = (
                    f"the request needs more cache pages than the partition "
                    f"has ({counts} new pages, {cache.num_free()} free)"
                )
                part.end(req, "error")
                failed.append((req, message))
                continue
            # NOTE: a fresh wire id per admission: a preempted request's old id may still
            # sit in freed_req_ids of a plan not sent yet, and the ranks must never see
            # block updates and a free for the same id in one plan.
            req.req_id = self._next_req_id
            self._next_req_id += 1
            part.admit(req, start, n)
            if req.num_preemptions == 0:
                req.num_cached_tokens = start
            if part.leases is not None and part.take_lease(req):
                self.spec.num_lease_scrubs += 1
            if req.params.needs_sampling_spec:
                part.new_sampling.append(sampling_spec(req))
            if hit:
                cache.share(req.pages)
                updates += [
                    BlockUpdate(req.req_id, f, fp.first_page, i32(fp.block_ids))
                    for f, fp in enumerate(req.pages)
                    if fp.block_ids
                ]
            if self.prefix is not None:
                self.prefix.start(req, start)
            part.allocate(req, counts, updates)
            prefills.append((req, n))
            budget -= n
        return failed
