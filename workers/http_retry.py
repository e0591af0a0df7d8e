"""Backoff for the HTTP clients of OpenAI-compatible endpoints (embeddings,
chat): exponential with jitter (:mod:`memq.contracts.backoff`), or the
server's Retry-After, capped; and :class:`ChatEndpoint`, the chat endpoint
the summarizer and the fact extractor both post to (kinds may not import
each other, so it lives here).

Written here rather than taken from a retry library: two call sites, a
dozen lines, and the server's Retry-After must win over the schedule.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from memq.contracts.backoff import doubling, spread
from memq.workers.settings import LLMSettings, mask_url

log = logging.getLogger("memq.http")


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
    wait = spread(doubling(attempt, base_s), 0.25) if server_says is None else max(server_says, 0.0)
    return min(max_s, wait)  # after the spread: a capped delay is never spread below the cap


EXCERPT_CHARS = 200


def excerpt(text: str, secret: str | None = None) -> str:
    """A reply body for an error message: the secret redacted first (some
    servers echo what they were sent), whitespace folded, cut short."""
    if secret:
        text = text.replace(secret, "***")
    return " ".join(text.split())[:EXCERPT_CHARS]


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    body: dict,
    *,
    error: type[Exception],
    where: str,
    what: str,
    attempts: int,
    base_s: float,
    max_s: float,
    timeout_s: float | None = None,
    secret: str | None = None,
    logger: logging.Logger = log,
) -> httpx.Response:
    """POST ``body``; return the 200 reply. Timeouts, transport errors, 429
    and 5xx are retried (``attempts`` in all) with :func:`delay`; any other
    status, or the last failure, raises ``error``. ``timeout_s`` bounds each
    whole attempt (httpx's timeout is per read: a server trickling bytes could
    hold a call forever); ``where`` names the endpoint in messages and ``what``
    the call in logs (``logger``, default ``memq.http``); ``secret`` is
    redacted from error bodies."""
    for attempt in range(attempts):
        server_says = None
        try:
            if timeout_s is None:
                reply = await client.post(url, json=body)
            else:
                async with asyncio.timeout(timeout_s):
                    reply = await client.post(url, json=body)
        except (TimeoutError, httpx.TransportError) as e:  # timeouts, refused/reset connections
            if isinstance(e, httpx.TimeoutException):
                reason = f"timeout ({type(e).__name__})"
            else:
                reason = "timeout" if isinstance(e, TimeoutError) else type(e).__name__
        else:
            if reply.status_code == 200:
                return reply
            reason = f"HTTP {reply.status_code}"
            if not retryable(reply):
                raise error(f"{where} answered {reason}: {excerpt(reply.text, secret)}")
            server_says = retry_after(reply)
        if attempt + 1 == attempts:
            raise error(f"{where} failed {attempts} time(s), last: {reason}")
        wait = delay(attempt, base_s, max_s, server_says)
        logger.warning("%s: %s from %s, retry %d in %.2fs", what, reason, where, attempt + 1, wait)
        await asyncio.sleep(wait)
    raise AssertionError("unreachable")


class ChatEndpoint:
    """``POST {base_url}/chat/completions`` of one ``LLMSettings``: the
    Bearer header (never logged), a timeout per attempt, retries as
    :func:`post_json`, failures raised as ``error``. ``transport``: httpx's
    (tests answer from a script)."""

    def __init__(
        self, settings: LLMSettings, *, error: type[Exception], transport: httpx.AsyncBaseTransport | None = None
    ):
        self.settings = settings
        self.error = error
        self.url = settings.base_url.rstrip("/") + "/chat/completions"
        self.where = mask_url(self.url)  # for messages: no password of the URL
        self.secret = settings.api_key.get_secret_value() if settings.api_key else None
        headers = {"Authorization": f"Bearer {self.secret}"} if self.secret else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(settings.timeout_s), transport=transport)

    async def post(
        self, body: dict, *, what: str, base_s: float, max_s: float, logger: logging.Logger = log
    ) -> httpx.Response:
        """The 200 reply to ``body`` (``base_s``/``max_s``: the caller's backoff, which its tests shorten)."""
        return await post_json(
            self.client,
            self.url,
            body,
            error=self.error,
            where=self.where,
            what=what,
            attempts=self.settings.retries + 1,
            base_s=base_s,
            max_s=max_s,
            timeout_s=self.settings.timeout_s,
            secret=self.secret,
            logger=logger,
        )

    async def close(self) -> None:
        await self.client.aclose()
