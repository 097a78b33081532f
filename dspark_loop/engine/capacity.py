"""Will a request ever fit? The pages it needs at its peak, alone in a partition.

A request writes KV for positions [0, E) with E = prompt + max_tokens - 1 (the last
token is sampled, never written), plus up to K draft rows past it at K=7, capped by the
context. Full-history families (c{r}) hold every page up to E at the end. The ring
(swa) holds only the pages a step can read or write: a step writing [s, s+n) keeps
[first_live_page(s), pages_needed(s+n)), at most ceil((n + window - 1) / page) + 1
pages, where n is the largest step the request takes alone (a prefill chunk, or the
8-row verify tile). One page of slack on the ring makes this an upper bound: a request
past it can never run, and one within it runs once it is alone.
"""
from __future__ import annotations

from dspark_loop.cache_layout import CacheLayout
from dspark_loop.engine.kv_cache import pages_needed


def peak_pages(layout: CacheLayout, prompt_len: int, max_tokens: int, *, max_model_len: int,
               chunk_cap: int, spec_k: int) -> list[int]:
    """Pages per family the request holds at its peak when it runs alone."""
    end = min(prompt_len + max_tokens - 1 + spec_k, max_model_len)
    step_rows = max(min(chunk_cap, prompt_len), spec_k + 1)
    out = []
    for fam in layout.families:
        need = pages_needed(fam, end)
        if fam.ring:
            span = step_rows + fam.window - 1
            need = min(need, -(-span // fam.tokens_per_page) + 1)
        out.append(need)
    return out


def capacity_problem(layout: CacheLayout, num_blocks: list[int], prompt_len: int,
                     max_tokens: int, *, max_model_len: int, chunk_cap: int,
                     spec_k: int) -> str | None:
    """Why the request can never fit a partition's pools (num_blocks per family), or None."""
    need = peak_pages(layout, prompt_len, max_tokens, max_model_len=max_model_len,
                      chunk_cap=chunk_cap, spec_k=spec_k)
    for fam, n, have in zip(layout.families, need, num_blocks):
        if n > have:
            return (f"This request can never fit the KV cache: {prompt_len} prompt + "
                    f"{max_tokens} output tokens need {n} pages of the {fam.name} cache "
                    f"family, and a partition has {have}. Shorten the prompt or max_tokens.")
    return None
