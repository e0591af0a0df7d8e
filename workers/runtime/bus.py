"""NATS connection and idempotent JetStream setup, from settings.

The events streams (``MEMQ_EVENTS``, and one per app where
``streams.apps`` lists apps: :mod:`memq.workers.runtime.event_streams`) keep
every message (Limits retention) so an index can be rebuilt by replay;
``MEMQ_DLQ`` keeps dead letters with their reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError, ServiceUnavailableError
from pydantic import ValidationError

from memq.contracts.backoff import doubling
from memq.contracts.connection import NatsUnreachable, connect_nats  # noqa: F401 (what connect raises)
from memq.contracts.subjects import ARTIFACT_BUCKET, DLQ_WILDCARD
from memq.workers.runtime import event_streams

# Where NATS is, without nats-py: `memq config` reads it (memq.workers.runtime.embedded_nats).
from memq.workers.runtime.embedded_nats import NatsNotFound, nats_url  # noqa: F401 (re-exported)
from memq.workers.settings import NatsSettings, Settings, StreamSettings, mask_url

T = TypeVar("T")

log = logging.getLogger("memq.bus")

DAY = 86_400.0


NATS_HINT = "is `memq up` running, or MEMQ_NATS__URL right?"
NATS_AUTH_HINT = "check MEMQ_NATS__USER/PASSWORD/TOKEN"


def _tls_context(nats_settings: NatsSettings) -> ssl.SSLContext | None:
    tls = nats_settings.tls
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file) if tls.key_file else None)
    return ctx


def connect_options(settings: Settings, name: str) -> dict[str, Any]:
    n = settings.nats
    opts: dict[str, Any] = {
        "servers": [u.strip() for u in nats_url(settings).split(",")],
        "name": f"{n.name}-{name}",
        "connect_timeout": n.connect_timeout_s,
        # Once connected, workers ride out a NATS restart; their first connect
        # still fails after two tries per server (memq.contracts.connection).
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
    }
    if n.user:
        opts["user"] = n.user
    if n.password:
        opts["password"] = n.password.get_secret_value()
    if n.token:
        opts["token"] = n.token.get_secret_value()
    if n.creds_file:
        opts["user_credentials"] = str(n.creds_file)
    if n.inbox_prefix:
        opts["inbox_prefix"] = n.inbox_prefix
    if (tls := _tls_context(n)) is not None:
        opts["tls"] = tls
    return opts


TLS_ALERT_WAIT_S = 1.0  # how long a failed TLS connect waits for the server's alert to be read


class NatsTLSError(RuntimeError):
    """The TLS handshake with NATS failed (wrong CA, refused certificate): a
    setting to fix, not an outage to wait out."""


async def open_connection(options: dict[str, Any]) -> NATS:
    """:func:`memq.contracts.connection.connect_nats` with ``options`` (those of
    :func:`nats.connect`), but a failed TLS handshake raises
    :class:`NatsTLSError` at once: nats-py would hang on it forever (nats.py#718).

    :raises NatsUnreachable: no server answered (within two tries each) or
        one refused the credentials; the message says which and what to check.
    """
    user_cb = options.get("error_cb")
    tls_failed: asyncio.Future = asyncio.get_running_loop().create_future()
    closed: list[Exception] = []  # the server hung up on an open connection

    async def error_cb(exc: Exception) -> None:
        if isinstance(exc, ssl.SSLError) and not tls_failed.done():
            tls_failed.set_result(exc)
        if isinstance(exc, BrokenPipeError | ConnectionResetError):
            closed.append(exc)
        if user_cb is not None:
            await user_cb(exc)

    hints = {"hint": NATS_HINT, "auth_hint": NATS_AUTH_HINT}
    connecting = asyncio.ensure_future(connect_nats(**{**options, **hints, "error_cb": error_cb}))
    await asyncio.wait({connecting, tls_failed}, return_when=asyncio.FIRST_COMPLETED)
    # A TLS 1.3 server refuses a missing client certificate after the client's
    # handshake is done, so the error callback and the failed connect can land
    # in the same loop turn, or the connect can fail first on the closed
    # socket (a broken pipe) with the alert still in flight: the TLS error
    # wins, it is the one to fix.
    if not tls_failed.done() and "tls" in options and connecting.done() and connecting.exception() is not None:
        await asyncio.wait({tls_failed}, timeout=TLS_ALERT_WAIT_S)
    if not tls_failed.done():
        tls_failed.cancel()
        if "tls" in options and closed and connecting.exception() is not None:
            # The alert was lost with the socket: a TLS server that hangs up
            # right after the handshake has refused this client (its certificate).
            servers = ", ".join(mask_url(u) for u in options.get("servers", []))
            raise NatsTLSError(
                f"TLS connection to NATS at {servers} closed after the handshake ({type(closed[0]).__name__}): "
                "the server refused this client, as one that requires a client certificate does when none is sent"
            ) from None
        return connecting.result()
    if connecting.done() and connecting.exception() is None:
        await connecting.result().close()
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await connecting
    exc = tls_failed.result()
    servers = ", ".join(mask_url(u) for u in options.get("servers", []))
    raise NatsTLSError(f"TLS handshake with NATS at {servers} failed: {type(exc).__name__}: {exc}")


async def connect(settings: Settings, name: str, **callbacks: Any) -> NATS:
    """Connect with the settings' options (plus nats-py callbacks, e.g. reconnected_cb)."""
    return await open_connection({**connect_options(settings, name), **callbacks})


def dlq_stream_config(s: StreamSettings) -> StreamConfig:
    return StreamConfig(
        name=s.dlq,
        description="memq: messages no worker could process, with the reason",
        subjects=[DLQ_WILDCARD],
        retention=RetentionPolicy.LIMITS,
        max_age=s.dlq_max_age_days * DAY,
        duplicate_window=s.duplicate_window_s,  # a retried dead-lettering is stored once
        storage=StorageType(s.storage),
        num_replicas=s.replicas,
    )


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> str:
    """Create the stream or bring its mutable settings up to date.

    Returns "created", "updated" or "unchanged".
    """
    if config.name is None:  # nats-py's StreamConfig allows it; a stream cannot be found without one
        raise ValueError("a stream config needs a name")
    try:
        info = await js.stream_info(config.name)
    except NotFoundError:
        await js.add_stream(config)
        log.info("created stream %s", config.name)
        return "created"
    current = info.config
    # first_seq is where a stream starts, given once at its creation
    wanted = {k: v for k, v in config.as_dict().items() if k not in ("name", "first_seq")}
    have = current.as_dict()
    if all(_same(k, have.get(k), v) for k, v in wanted.items()):
        return "unchanged"
    try:
        await js.update_stream(replace(config, first_seq=None))
    except BadRequestError as exc:  # e.g. storage type cannot change
        log.warning("stream %s differs from settings but cannot be updated: %s", config.name, exc)
        return "unchanged"
    log.info("updated stream %s", config.name)
    return "updated"


def _same(key: str, have: Any, wanted: Any) -> bool:
    if key == "metadata":  # the server adds keys of its own (_nats.*)
        return all((have or {}).get(k) == v for k, v in (wanted or {}).items())
    return bool(have == wanted)


# JetStream busy or without a leader for a moment (a cluster electing one, or
# creating R3 streams for several workers starting at once): try again.
_TRANSIENT = (nats.errors.TimeoutError, ServiceUnavailableError)


async def patiently(what: str, call: Callable[[], Awaitable[T]], patience_s: float = 60.0) -> T:
    """``call()``, retried for up to ``patience_s`` while JetStream is
    transiently unavailable; then what it raises. For the JetStream requests
    a worker cannot start without (seen in tests/faults: a worker starting
    beside others on a fresh 3-node cluster timed out and exited)."""
    deadline = time.monotonic() + patience_s
    attempt = 0
    while True:
        try:
            return await call()
        except _TRANSIENT as exc:
            delay = doubling(attempt, 0.5, 5.0)
            if time.monotonic() + delay > deadline:
                raise
            log.warning("JetStream unavailable (%s); %s again in %.1fs", type(exc).__name__, what, delay)
            await asyncio.sleep(delay)
            attempt += 1


async def settle(nc: NATS) -> None:
    """Return once the server has read every subscription ``nc`` has made, so
    a request from another connection finds its responder.

    One ``nc.flush()`` does not promise it (nats-py 2.16): it writes its PING
    to the socket at once, ahead of the SUBs still queued for the client's
    flusher task, and the PONG can come back before the server read them (a
    CI run under load got "no responders" from a worker that said it was
    ready). That flush wakes the flusher, which writes the queue while we
    wait for the PONG, so the second PING follows the SUBs.
    """
    await nc.flush()
    await nc.flush()


async def ensure_streams(js: JetStreamContext, s: StreamSettings, patience_s: float = 60.0) -> dict[str, str]:
    """Idempotent setup of the event log, the DLQ and the artifact bucket,
    retried for up to ``patience_s`` while JetStream is transiently unavailable."""
    return await patiently("setting up streams", lambda: _ensure_streams(js, s), patience_s)


async def _ensure_streams(js: JetStreamContext, s: StreamSettings) -> dict[str, str]:
    # The shared stream first: in per-app mode its subjects are retired
    # before the apps' streams take them (JetStream refuses overlaps).
    result = {s.events: await ensure_stream(js, event_streams.shared_stream_config(s))}
    if s.apps:
        first_seq = (await js.stream_info(s.events)).state.last_seq + 1
        for app in sorted(s.apps):
            config = event_streams.app_stream_config(s, app, first_seq)
            result[str(config.name)] = await ensure_stream(js, config)
    result[s.dlq] = await ensure_stream(js, dlq_stream_config(s))
    try:
        await js.object_store(ARTIFACT_BUCKET)
        result[ARTIFACT_BUCKET] = "unchanged"
    except BucketNotFoundError:
        await js.create_object_store(ARTIFACT_BUCKET, storage=StorageType(s.storage), replicas=s.replicas)
        result[ARTIFACT_BUCKET] = "created"
    return result


def malformed_notice(subject: str, exc: ValidationError) -> None:
    """A notice that does not parse is logged in one line and dropped: it is
    no instruction to anyone, and the subscriber goes on with the next."""
    errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:3])
    log.warning("ignoring a malformed notice on %s: %s", subject, errors)
