"""The served benchmarks' prompts (tools/bench/served.py, tools/bench/mixed.py): fixed, distinct id
sequences, so runs compare and streams share no prefix."""

from __future__ import annotations


def prompt_ids(n: int, index: int, vocab_size: int) -> list[int]:
    """Distinct fixed-length id prompts (no prefix sharing between streams)."""
    return [2 + (index * 7919 + i * 104729) % (vocab_size - 2) for i in range(n)]
