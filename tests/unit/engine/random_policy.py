"""A verify policy for exactness tests: random verify lengths in 0..cap, random drafter
skips every step and random prompt drafter passes, from a seeded numpy Generator
(test-only; a real policy is deterministic)."""

from __future__ import annotations

import numpy as np

from dspark_loop.engine.verify.policy import StepFeedback, VerifyChoice


class RandomPolicy:
    per_step = True
    learns = True

    def __init__(self, seed: int, p_draft: float = 0.7):
        self.rng = np.random.default_rng(seed)
        self.p_draft = p_draft
        self.calls: list[tuple[np.ndarray, np.ndarray, np.ndarray, VerifyChoice]] = []
        self.observed: list[StepFeedback] = []

    def choose(
        self, conf: np.ndarray, cap: np.ndarray, partition: np.ndarray, sampled=None, constrained=None, prompt_rows=None
    ) -> VerifyChoice:
        choice = VerifyChoice(self.rng.integers(0, cap + 1).astype(np.int32), self.rng.random(len(cap)) < self.p_draft)
        self.calls.append((conf.copy(), cap.copy(), partition.copy(), choice))
        return choice

    def drafts_prompt(self, cls: int) -> bool:
        return bool(self.rng.random() < self.p_draft)

    def observe(self, feedback: StepFeedback) -> None:
        self.observed.append(feedback)

    def stats(self) -> dict:
        return {"name": type(self).__name__, "num_steps": len(self.calls)}
