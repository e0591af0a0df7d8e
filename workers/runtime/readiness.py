"""Readiness checks a worker kind can name (:mod:`memq.workers.runtime.kinds`).

Each builder takes a started component and returns an async check that
returns when the component is ready in that respect and raises
:class:`NotReady` (or the failing call's own error) when it is not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text

Check = Callable[[], Awaitable[None]]


class NotReady(Exception):
    """A readiness check failed; the message says why."""


def nats(worker: Any) -> Check:
    async def check() -> None:
        nc = getattr(worker, "nc", None)
        if nc is None or not nc.is_connected:
            reconnecting = nc is not None and nc.is_reconnecting
            raise NotReady("not connected to NATS" + (" (reconnecting)" if reconnecting else ""))

    return check


def database(worker: Any) -> Check:
    async def check() -> None:
        async with worker.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    return check


def consumer(worker: Any) -> Check:
    async def check() -> None:
        batch_consumer = getattr(worker, "consumer", None)
        if batch_consumer is None or not batch_consumer.running:
            raise NotReady("the consumer is not fetching")

    return check


def index(worker: Any) -> Check:
    async def check() -> None:
        if not worker.ready.is_set():
            raise NotReady("preparing the index (rebuilding, or the index is unreachable)")
        await worker.backend.live()  # one cheap read: the index answers

    return check


def service(worker: Any) -> Check:
    async def check() -> None:
        if getattr(worker, "service", None) is None:
            raise NotReady("the query service is not registered")

    return check


def http(worker: Any) -> Check:
    async def check() -> None:
        if getattr(worker, "url", None) is None:
            raise NotReady("the HTTP gateway is not serving")

    return check


CHECKS: dict[str, Callable[[Any], Check]] = {
    "nats": nats,
    "database": database,
    "consumer": consumer,
    "index": index,
    "service": service,
    "http": http,
}
