"""A tokens-per-minute budget per app, over a sliding minute: pure logic
(the caller passes the clock)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Budget:
    """Tokens an app spent in the last minute (this replica's calls)."""

    per_minute: int | None
    spent: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)

    def wait_s(self, app: str, now: float) -> float:
        """0 when the app may call now, else how long until the minute frees enough."""
        if self.per_minute is None:
            return 0.0
        calls = self.spent.setdefault(app, deque())
        while calls and calls[0][0] <= now - 60:
            calls.popleft()
        if sum(n for _, n in calls) < self.per_minute:
            return 0.0
        return max(0.05, calls[0][0] + 60 - now)

    def spend(self, app: str, tokens: int, now: float) -> None:
        if self.per_minute is not None and tokens:
            self.spent.setdefault(app, deque()).append((now, tokens))
