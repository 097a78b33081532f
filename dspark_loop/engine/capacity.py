"""Will a request ever fit? The pages it holds at its peak, alone in a partition.

Alone, a request prefills in chunks [i*c, (i+1)*c) of the chunk cap c, then decodes: the
step at num_computed s writes [s, s+8) at K=7 (1 row at K=0, or once 8 rows would pass
the context); the last token is sampled, never written. Full-history families (c{r})
hold every page up to the last write. The ring (swa) holds [first_live_page(s),
pages_needed(e)) during a step writing [s, e) (pages behind the window are released
after every step); that count depends only on e - s and s mod page once s is past the
window, so a few chunks and decode steps give its maximum exactly.
This is exact for the scheduler alone in a partition: a request within it runs once it
is alone; one past it never could (the scheduler would fail it after waiting).
"""

from __future__ import annotations

from dspark_loop.contract.cache_layout import CacheLayout, Family
from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.kv_cache import pages_needed


def _ring_peak(fam: Family, prompt_len: int, num_decodes: int, chunk: int, rows_at) -> int:
    def held(s: int, e: int) -> int:
        return pages_needed(fam, e) - fam.first_live_page(s)

    settle = fam.window + fam.tokens_per_page + DSPARK_K + 1  # past this the counts repeat
    num_chunks = -(-prompt_len // chunk)
    chunks = set(range(min(num_chunks, settle // chunk + fam.tokens_per_page + 1)))
    peak = max(held(i * chunk, min((i + 1) * chunk, prompt_len)) for i in chunks | {num_chunks - 1})
    for s in range(prompt_len, prompt_len + min(num_decodes, settle)):
        peak = max(peak, held(s, s + rows_at(s)))
    return peak


def peak_pages(
    layout: CacheLayout, prompt_len: int, max_tokens: int, *, max_model_len: int, chunk_cap: int, spec_k: int
) -> list[int]:
    """Pages per family the request holds at its peak when it runs alone."""

    def rows_at(s: int) -> int:  # rows a decode step at num_computed s writes
        return spec_k + 1 if spec_k and s + spec_k + 1 <= max_model_len else 1

    num_decodes = max_tokens - 1  # decode steps start at s = prompt_len .. prompt_len + M - 2
    last = prompt_len + num_decodes - 1
    end = max(prompt_len, last + rows_at(last) if num_decodes else 0)
    out = []
    for fam in layout.families:
        if fam.ring:
            out.append(_ring_peak(fam, prompt_len, num_decodes, chunk_cap, rows_at))
        else:
            out.append(pages_needed(fam, end))
    return out


def capacity_problem(
    layout: CacheLayout,
    num_blocks: list[int],
    prompt_len: int,
    max_tokens: int,
    *,
    max_model_len: int,
    chunk_cap: int,
    spec_k: int,
) -> str | None:
    """Why the request can never fit a partition's pools (num_blocks per family), or None."""
    need = peak_pages(layout, prompt_len, max_tokens, max_model_len=max_model_len, chunk_cap=chunk_cap, spec_k=spec_k)
    for fam, n, have in zip(layout.families, need, num_blocks):
        if n > have:
            return (
                f"This request can never fit the KV cache: {prompt_len} prompt + "
                f"{max_tokens} output tokens need {n} pages of the {fam.name} cache "
                f"family, and a partition has {have}. Shorten the prompt or max_tokens."
            )
    return None
