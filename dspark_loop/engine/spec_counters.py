"""DSpark (K=7) totals over the engine's life, updated by step_update and read at run time
(EngineLoop.dspark_summary()); per-request counters live on Request."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger("dspark_loop.engine.dspark")

LOG_INTERVAL_S = 10.0  # seconds between progress lines (and one at the first verify)


class VerifyCounts:
    """What follows from num_verify_steps and num_accepted (a request's or the engine's)."""

    __slots__ = ()
    num_verify_steps: int
    num_accepted: int
    num_proposed: int  # drafts verified: the verify lengths' sum (DSPARK_K per full verify)

    @property
    def num_matched(self) -> int:
        """Drafts that matched the target's prediction: a verify accepts them + 1 token."""
        return self.num_accepted - self.num_verify_steps


@dataclass
class SpecCounters(VerifyCounts):
    num_requests: int = 0  # requests that verified at least once
    num_verify_steps: int = 0  # per request: one verify of 1..DSPARK_K drafts (1 + l rows)
    num_accepted: int = 0  # tokens accepted by the chain (before finish truncation)
    num_fallback_steps: int = 0  # 1-row steps forced by the position ceiling
    num_lease_scrubs: int = 0
    num_proposed: int = 0
    num_drafter_skips: int = 0  # drafter passes a verify policy skipped (adaptive verification)
    num_verify_rows: int = 0  # decode rows of verifies (1 + l each)
    last_log_time: float = -LOG_INTERVAL_S
    log_progress: bool = True  # False: a scheduler that serves nobody (the start-up profile's)

    @property
    def mean_accepted_len(self) -> float:
        return self.num_accepted / self.num_verify_steps if self.num_verify_steps else 0.0

    def add_verifies(self, num_verifies: int, now: float | None = None) -> None:
        """Called after a step's verifies were counted: logs the progress line at the
        first verify, then at most every LOG_INTERVAL_S. NOTE: by time, not by count: at
        256 requests a count rule wrote a line per step."""
        if not num_verifies or not self.log_progress:
            return
        now = time.monotonic() if now is None else now
        if self.num_verify_steps == num_verifies or now - self.last_log_time >= LOG_INTERVAL_S:
            self.last_log_time = now
            log.info("%s", self.progress_line())

    def progress_line(self) -> str:
        return (
            f"DSpark speculation progress: requests={self.num_requests} "
            f"verifies={self.num_verify_steps} matched={self.num_matched} "
            f"proposed={self.num_proposed} accepted={self.num_accepted} "
            f"mean_len={self.mean_accepted_len:.2f} fallbacks={self.num_fallback_steps}"
        )

    def summary(self) -> dict:
        return {
            "num_requests": self.num_requests,
            "num_verify_steps": self.num_verify_steps,
            "num_proposed": self.num_proposed,
            "num_matched": self.num_matched,
            "num_accepted": self.num_accepted,
            "num_fallback_steps": self.num_fallback_steps,
            "num_lease_scrubs": self.num_lease_scrubs,
            "num_drafter_skips": self.num_drafter_skips,
            "num_verify_rows": self.num_verify_rows,
            "mean_accepted_len": round(self.mean_accepted_len, 4),
        }
