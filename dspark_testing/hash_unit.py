"""A pure uniform draw per element, a function of its keys only (the policy simulator's
tokens, acceptance and noise; no stateful generator)."""

from __future__ import annotations

import numpy as np


def unit(*keys) -> np.ndarray:
    """A uniform number in [0, 1) per element: splitmix64 of the keys (pure)."""
    h = np.zeros(np.broadcast(*[np.asarray(k) for k in keys]).shape, np.uint64)
    with np.errstate(over="ignore"):
        for k in keys:
            h = h ^ np.asarray(k).astype(np.uint64)
            h = (h + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
            h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = h ^ (h >> np.uint64(31))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53
