"""Deterministic prompts for the e2e tests: texts and token-id lists of chosen lengths."""

from __future__ import annotations

import numpy as np

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Once upon a time, in a land far away, there lived a scheduler who never dropped a page.",
]


def token_prompt(length: int, seed: int, vocab_size: int = 1024) -> list[int]:
    """length ids in [2, vocab): no BOS/EOS inside, the same list for the same seed."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(2, vocab_size, size=length)]


def mixed_prompts(num: int, seed: int = 100) -> list[list[int]]:
    """num token prompts whose lengths spread from 1 to ~200 (pages, windows, ratios)."""
    lengths = [1 + (i * 37) % 200 for i in range(num)]
    return [token_prompt(n, seed + i) for i, n in enumerate(lengths)]
