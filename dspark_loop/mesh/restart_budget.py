"""RestartBudget: at most N mesh restarts in any sliding window, so a crash loop ends.

budget = RestartBudget(max_restarts=3, window_s=600)
if budget.take(now): restart ...   else: stay dead, budget.why() in the log and /health
"""

from __future__ import annotations

from collections import deque

RESTART_WINDOW_S = 600.0  # the sliding window --max-rank-restarts counts in


class RestartBudget:
    def __init__(self, max_restarts: int, window_s: float = RESTART_WINDOW_S):
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.times: deque[float] = deque()  # restarts inside the window, oldest first

    def available(self, now: float) -> bool:
        """Whether take(now) would succeed (spends nothing)."""
        while self.times and now - self.times[0] >= self.window_s:
            self.times.popleft()
        return len(self.times) < self.max_restarts

    def take(self, now: float) -> bool:
        """Spend one restart at `now` if the window allows it."""
        if not self.available(now):
            return False
        self.times.append(now)
        return True

    @property
    def used(self) -> int:
        return len(self.times)

    def why(self) -> str:
        return f"{self.max_restarts} rank-mesh restart(s) already in the last {self.window_s:g} s (--max-rank-restarts)"
