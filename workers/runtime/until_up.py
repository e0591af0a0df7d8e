"""Waiting out a dependency's outage: ask whether it is back every
``poll_s`` with a cheap check (``SELECT 1``, Weaviate's liveness) instead of
sleeping through a whole retry delay, so work resumes within about
``poll_s`` of the repair rather than up to the delay later (30 s at the end
of the default schedule)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

POLL_S = 0.5  # a refused connection costs next to nothing; a check bounded by CHECK_TIMEOUT_S
CHECK_TIMEOUT_S = 2.0  # a dependency that accepts and never answers counts as down


async def until_up(
    check: Callable[[], Awaitable[bool]],
    within: float,
    *,
    poll_s: float = POLL_S,
    check_timeout_s: float = CHECK_TIMEOUT_S,
) -> bool:
    """Sleep ``poll_s`` then ``check()``, again and again, until it returns
    True (True at once) or ``within`` seconds have passed (False). A check
    that raises or takes over ``check_timeout_s`` counts as down."""
    deadline = time.monotonic() + within
    while (remaining := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(poll_s, remaining))
        try:
            if await asyncio.wait_for(check(), check_timeout_s):
                return True
        except Exception:  # noqa: BLE001, S112 - still down, whatever the way it fails
            continue
    return False
