"""The readiness checks a component declares (:meth:`memq.workers.runtime.component.Component.checks`).

Each builder takes what to check, as a getter read when the check runs (a
component's running parts exist only once it opened), and returns an async
check that returns when ready in that respect and raises :class:`NotReady`
(or the failing call's own error) when not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from nats.aio.client import Client as NATS
from sqlalchemy import text

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from memq.workers.index.backends.base import IndexBackend

Check = Callable[[], Awaitable[None]]


class NotReady(Exception):
    """A readiness check failed; the message says why."""


class _Running(Protocol):
    @property
    def running(self) -> bool: ...


def nats(connection: Callable[[], NATS | None]) -> Check:
    async def check() -> None:
        nc = connection()
        if nc is None or not nc.is_connected:
            reconnecting = nc is not None and nc.is_reconnecting
            raise NotReady("not connected to NATS" + (" (reconnecting)" if reconnecting else ""))

    return check


def database(engine: Callable[[], AsyncEngine]) -> Check:
    async def check() -> None:
        async with engine().connect() as conn:
            await conn.execute(text("SELECT 1"))

    return check


def consumer(batch_consumer: Callable[[], _Running | None]) -> Check:
    async def check() -> None:
        running = batch_consumer()
        if running is None or not running.running:
            raise NotReady("the consumer is not fetching")

    return check


def index(ready: asyncio.Event, backend: Callable[[], IndexBackend]) -> Check:
    async def check() -> None:
        if not ready.is_set():
            raise NotReady("preparing the index (rebuilding, or the index is unreachable)")
        await backend().live()  # one cheap read: the index answers

    return check


def present(value: Callable[[], object | None], missing: str) -> Check:
    """Ready once ``value()`` is set (a registered service, a serving URL)."""

    async def check() -> None:
        if value() is None:
            raise NotReady(missing)

    return check
