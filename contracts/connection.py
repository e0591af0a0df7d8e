"""Connecting to NATS: the first connect fails fast and clearly, reconnects
after it follow the caller's policy.

nats-py makes no difference between the two: its initial connect loops over
the servers until ``max_reconnect_attempts`` is used up (60 tries, 2 s apart,
by default; forever with -1), logging a traceback per try, and
``allow_reconnect=False`` does not stop that loop (it only covers protocol
errors after the TCP connect). So the first connect runs with
``max_reconnect_attempts=1`` (each server tried twice) and the caller's value
is put in place once connected: nats-py reads ``nc.options`` on every
reconnect.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.errors
from nats.aio.client import Client

from memq.contracts.errors import Unavailable

log = logging.getLogger("memq.nats")


def _drop_tls_eof_warning(record: logging.LogRecord) -> bool:
    """nats-py's TLS transport never tells its stream protocol that it runs
    over TLS (nats.py#574), so asyncio warns "returning true from
    eof_received() has no effect when using ssl" each time a TLS connection
    to NATS closes: a WARNING in `memq init`'s output and every client's, on
    every TLS deployment, about nothing (the close is complete either way)."""
    return record.getMessage() != "returning true from eof_received() has no effect when using ssl"


logging.getLogger("asyncio").addFilter(_drop_tls_eof_warning)

DEFAULT_RECONNECT_ATTEMPTS = 60  # nats-py's own default, for the reconnects after the first connect
FIRST_CONNECT_ATTEMPTS = 1  # the smallest bound nats-py honours (0 would mean forever): two tries per server
ErrorCallback = Callable[[Exception], Awaitable[None]]


class NatsUnreachable(Unavailable):
    """The first connect to NATS failed: no server answered, or it refused
    the credentials. The message names the URL(s) and what to check."""


async def connect_nats(
    servers: str | Sequence[str],
    *,
    max_reconnect_attempts: int = DEFAULT_RECONNECT_ATTEMPTS,
    error_cb: ErrorCallback | None = None,
    hint: str = "is the NATS server running, and the URL right?",
    auth_hint: str = "check the user, password or token",
    **options: Any,
) -> Client:
    """``nats.connect`` with a bounded, quiet first connect.

    :param servers: one URL, a comma-separated list, or a list of URLs.
    :param max_reconnect_attempts: reconnects per server once connected
        (after a NATS restart or a network cut); -1 tries forever, as a
        long-running worker or agent wants. Default 60 (nats-py's). The first
        connect never loops: each server is tried twice,
        ``reconnect_time_wait`` apart, and then :class:`NatsUnreachable`
        is raised.
    :param error_cb: nats-py's error callback, called for every error,
        the first connect's included. Default: none while connecting (the
        failure is raised once), one log line per error afterwards.
    :param hint: what to check when no server answered (end of the message).
    :param auth_hint: what to check when a server refused the credentials.
    :param options: any other :func:`nats.connect` option (``connect_timeout``,
        ``reconnect_time_wait``, auth, TLS, callbacks…).
    :raises NatsUnreachable: (an :class:`~memq.contracts.errors.Unavailable`) when
        no server could be reached or one refused the credentials.
    """
    urls = [u.strip() for u in servers.split(",")] if isinstance(servers, str) else list(servers)
    _refuse_http(urls)
    failures: list[Exception] = []
    connected = False

    async def on_error(exc: Exception) -> None:
        if not connected:
            failures.append(exc)
        if error_cb is not None:
            await error_cb(exc)
        elif connected:
            log.warning("nats: %s", _describe(exc))

    try:
        nc = await nats.connect(urls, error_cb=on_error, max_reconnect_attempts=FIRST_CONNECT_ATTEMPTS, **options)
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        raise NatsUnreachable(unreachable_message(urls, failures or [exc], hint, auth_hint)) from None
    nc.options["max_reconnect_attempts"] = max_reconnect_attempts
    connected = True
    return nc


def _refuse_http(urls: Sequence[str]) -> None:
    """An ``http://`` URL (the gateway's, copied from `memq up`'s ready line)
    fails at once and says why: nats-py would take the scheme for a host
    name and fail with "Name or service not known"."""
    for url in urls:
        scheme = urlsplit(url).scheme.lower() if "://" in url else ""
        if scheme in ("http", "https"):
            raise NatsUnreachable(
                f"{redact(url)} is an HTTP URL, and memq's client speaks NATS: give it a nats:// (or tls://) URL, "
                "e.g. nats://127.0.0.1:4222 (`memq up` prints both); the HTTP gateway is for REST clients"
            )


def unreachable_message(urls: Sequence[str], failures: Sequence[Exception], hint: str, auth_hint: str) -> str:
    """One line: which URL, what went wrong (a refused login wins over the
    timeouts that follow it), what to check."""
    where = ", ".join(redact(u) for u in urls)
    refused = [f for f in failures if _is_auth_failure(f)]
    if refused:
        return f"NATS at {where} refused the credentials ({_describe(refused[-1])}): {auth_hint}"
    return f"cannot reach NATS at {where} ({_describe(failures[-1])}): {hint}"


def _is_auth_failure(exc: Exception) -> bool:
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower()


def _describe(exc: Exception) -> str:
    return str(exc).strip() or type(exc).__name__


def redact(url: str) -> str:
    """``url`` without its password (``nats://user:***@host``)."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.password is None and not (parts.username and "@" in parts.netloc):
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return f"{parts.scheme}://{user + ':' if parts.password is not None else ''}***@{host}"
