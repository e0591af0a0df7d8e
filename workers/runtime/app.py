r"""How a worker process is assembled: one FastStream app, one NATS connection.

:func:`assemble` builds, without connecting to anything:

- one :class:`MemqBroker` (a FastStream ``NatsBroker``) whose connection is
  memq's: servers, name, credentials, TLS and inbox prefix from the
  settings, and a bounded first connect that fails with one clear line
  (:func:`memq.workers.runtime.bus.open_connection`);
- one component per worker kind (:mod:`memq.workers.runtime.kinds`), each
  contributing one ``NatsRouter`` with its low-rate subscribers and
  publishers (commit notices, summarizer triggers, status events, typed by
  :mod:`memq.contracts.notices`), included in the broker;
- the process's shared dependencies
  (:class:`~memq.workers.runtime.resources.Resources`): the settings,
  one SQL engine, one index and one embedder, made as the components
  declare them (``Component.NEEDS``) and handed to each component when it
  opens (the components are :class:`~memq.workers.runtime.component.Component`\ s);
- the FastStream app, whose hooks run the lifecycle:

  1. ``on_startup``: migrate the database (once per process, if a kind uses
     SQL), connect, set up the streams (once per process), then open each
     component on the broker's connection (before any subscriber runs);
  2. the broker starts the FastStream subscribers;
  3. ``after_startup``: each component starts its hot path on the same
     connection (the owned batch consumer, the nats micro service, the
     query worker's committed notices: their modules say why these are not
     FastStream subscribers);
  4. ``on_shutdown``: the components stop, in reverse (a batch in hand is
     finished and acked); the broker then drains the connection;
  5. ``after_shutdown``: the shared dependencies are closed.

:func:`build_app` gives the bare ``FastStream`` app (for the AsyncAPI
document); the CLI runs :class:`Process` (``await start()``/``stop()``)
inside its own signal handling rather than ``faststream run``, to keep the
bounded stop, the per-worker progress lines and the metrics/health monitor
around the app.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from faststream import FastStream
from faststream.middlewares import AckPolicy, ExceptionMiddleware
from faststream.nats import NatsBroker, NatsMessage
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from pydantic import ValidationError

from memq.workers.runtime import bus
from memq.workers.runtime.component import Component, Live
from memq.workers.runtime.kinds import KINDS, Kind, kind_of
from memq.workers.runtime.resources import Need, Resources
from memq.workers.settings import Settings

log = logging.getLogger("memq.app")

DRAIN_TIMEOUT_S = 5  # a drain past this closes anyway: unacked work is redelivered


async def _malformed(exc: ValidationError, message: NatsMessage) -> None:
    bus.malformed_notice(message.raw_message.subject, exc)


class MemqBroker(NatsBroker):
    """A ``NatsBroker`` that connects the way every memq process does.

    FastStream's own connect is ``nats.connect``: unbounded on a dead URL
    (nats-py retries the first connect forever with
    ``max_reconnect_attempts=-1``) and silent on a failed TLS handshake. This
    one uses :func:`memq.workers.runtime.bus.open_connection`, which raises
    ``NatsUnreachable`` or ``NatsTLSError`` with one line after a couple of
    seconds; after that first connect, reconnects go on forever.
    """

    def __init__(self, settings: Settings, client_name: str, on_reconnected: Callable[[], Any] | None = None):
        self.memq_settings = settings
        self.client_name = client_name
        self._on_reconnected = on_reconnected
        super().__init__(
            # Only for the AsyncAPI document: the connection's servers come
            # from the settings when it connects (the URL a running `memq up`
            # left behind may not exist yet).
            servers=[u.strip() for u in (settings.nats.url or "nats://localhost:4222").split(",")],
            name=f"{settings.nats.name}-{client_name}",
            description="memq workers: the event log, commit notices, status events and queries",
            logger=logging.getLogger("memq.faststream"),
            log_level=logging.DEBUG,  # a line per notice is noise at INFO
            # docs/design.md, Facts that bite: FastStream's default terminates a JetStream message whose
            # handler raises. memq's JetStream consumers ack explicitly (owned
            # loop); should a FastStream one appear, a failure must redeliver.
            ack_policy=AckPolicy.NACK_ON_ERROR,
            # Every FastStream subscriber takes a typed notice (contracts.notices).
            middlewares=[ExceptionMiddleware(handlers={ValidationError: _malformed})],
            graceful_timeout=5.0,
        )

    async def _connect(self) -> NATS:
        options = bus.connect_options(self.memq_settings, self.client_name)
        options.update(drain_timeout=DRAIN_TIMEOUT_S, reconnected_cb=self._reconnected)
        connection = await bus.open_connection(options)
        self.config.connect(connection)
        return connection

    async def _reconnected(self) -> None:
        log.info("reconnected to NATS")
        if self._on_reconnected is not None:
            await self._on_reconnected()

    async def stop(self, *exc_info: Any) -> None:
        """Drain the connection, or close it when draining cannot work (NATS
        is away): stopping must not hang on an outage."""
        connection = self._connection
        try:
            await super().stop(*exc_info)
        except (TimeoutError, NatsError, OSError) as exc:
            log.warning("draining the NATS connection failed (%s); closing it", exc or type(exc).__name__)
            if connection is not None and not connection.is_closed:
                with contextlib.suppress(Exception):
                    await connection.close()
            self._connection = None
            self.config.disconnect()


class Process:
    """One worker process: its components in one FastStream app (see the
    module doc). ``on_starting(kind)`` is called before each component opens
    (the CLI prints a line: a first start can be slow). ``resources``: the
    shared dependencies (default: made from what the components need; a
    test hands in ones that hold its own index or embedder)."""

    def __init__(
        self,
        settings: Settings,
        components: Sequence[Component[Live]],
        *,
        on_starting: Callable[[str], None] | None = None,
        resources: Resources | None = None,
    ):
        self.settings = settings
        self.components = list(components)
        self.kinds: list[Kind] = [kind_of(c) for c in self.components]
        self.on_starting = on_starting
        self.resources = resources or Resources(settings, needs_of(self.components))
        name = self.kinds[0].name if len(self.kinds) == 1 else "workers"
        self.broker = MemqBroker(settings, name, on_reconnected=self._reconnected)
        for component in self.components:
            self.broker.include_router(component.router())
        self.app = FastStream(
            self.broker,
            logger=None,  # its "app starting" lines are ours to say
            on_startup=[self._open],
            after_startup=[self._start_hot_paths],
            on_shutdown=[self._stop_components],
            after_shutdown=[self.resources.close],
        )
        self._opened: list[Component[Live]] = []

    @property
    def connection(self) -> NATS:
        """The process's one NATS connection (once started)."""
        return self.broker.connection

    def component(self, kind: str) -> Component[Live]:
        return next(c for c, k in zip(self.components, self.kinds, strict=True) if k.name == kind)

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Start everything (see the module doc); raises what connecting
        raises (``NatsUnreachable``, ``NatsTLSError``, ``NatsNotFound``). A
        start cut short is undone by :meth:`stop`."""
        await self.app.start()

    async def stop(self) -> None:
        await self.app.stop()

    async def _open(self) -> None:
        s = self.settings
        if s.database.migrate_on_start and self.resources.needs["sql"]:
            from memq.workers.sql.engine import migrate

            await migrate(self.resources.engine)
        nc = await self.broker.connect()
        await bus.ensure_streams(nc.jetstream(), s.streams)
        for component, kind in zip(self.components, self.kinds, strict=True):
            if self.on_starting is not None:
                self.on_starting(kind.name)
            self._opened.append(component)  # stopped even if opening is cut short
            await component.open(nc, self.resources)

    async def _start_hot_paths(self) -> None:
        for component in self.components:
            await component.start()

    async def _stop_components(self) -> None:
        opened, self._opened = self._opened, []
        for component in reversed(opened):
            try:
                await component.stop()
            except Exception:  # one component's failure must not keep the others running
                log.exception("stopping the %s worker failed", kind_of(component).name)

    async def _reconnected(self) -> None:
        for component in self.components:
            await component.reconnected()


def needs_of(components: Iterable[Component[Live]]) -> Counter[Need]:
    """What ``components`` need of the process, counted (an SQL pool is sized by the count)."""
    return Counter(need for c in components for need in c.NEEDS)


def make_components(settings: Settings, kinds: Iterable[str]) -> list[Component[Live]]:
    return [KINDS[k].make(settings) for k in kinds]


def assemble(settings: Settings, kinds: Iterable[str] = tuple(KINDS), **options: Any) -> Process:
    """The process for ``kinds`` (names from :data:`memq.workers.runtime.kinds.KINDS`);
    nothing connects until :meth:`Process.start`."""
    return Process(settings, make_components(settings, kinds), **options)


def build_app(settings: Settings, kinds: Iterable[str] = tuple(KINDS)) -> FastStream:
    """The FastStream app of a process running ``kinds`` (pure construction)."""
    return assemble(settings, kinds).app
