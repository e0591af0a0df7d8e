"""Backoff for the HTTP clients of OpenAI-compatible endpoints (embeddings,
chat): exponential with jitter, or the server's Retry-After, capped.

Written here rather than taken from a retry library: two call sites, a
dozen lines, and the server's Retry-After must win over the schedule.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx


def retryable(reply: httpx.Response) -> bool:
    """429 and 5xx may pass; any other error status will not."""
    return reply.status_code == 429 or reply.status_code >= 500


def retry_after(reply: httpx.Response | None) -> float | None:
    """A Retry-After header in seconds (either form), or None."""
    value = reply.headers.get("retry-after") if reply is not None else None
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
    except (TypeError, ValueError):
        return None


def delay(attempt: int, base_s: float, max_s: float, server_says: float | None = None) -> float:
    """Seconds before attempt ``attempt + 1``: ``base_s * 2**attempt`` ±25 %,
    or what the server asked for, never above ``max_s``."""
    wait = base_s * 2**attempt * random.uniform(0.75, 1.25) if server_says is None else max(server_says, 0.0)
    return min(max_s, wait)
