"""The seam between the process (:mod:`memq.workers.runtime.app`) and a worker kind.

A kind is a :class:`Component` subclass. Two vocabularies, never mixed:
the process calls ``open``, ``start`` and ``stop`` (final: no kind
overrides them, mypy holds it), and a kind writes the hooks they call,
``router``, ``build``, ``run``, ``serve``, ``halt``, ``reconnected``,
``service_options`` and ``checks``, and states ``KIND`` (its name in
:data:`memq.workers.runtime.kinds.KINDS`), ``DESCRIPTION`` and ``NEEDS``.
The process calls, in order:

1. ``router()`` when it is assembled: the kind's FastStream subscribers and
   publishers (default: none);
2. ``open(nc, resources)`` once connected: :meth:`Component.build` makes the
   kind's running parts (a dataclass of its own, :class:`Live` at least)
   from the connection and the shared resources the kind declared in
   ``NEEDS``, and the component keeps them as :attr:`Component.live`;
3. ``start()`` after the FastStream subscribers run: :meth:`Component.run`
   starts the kind's hot path, then the component registers as a NATS micro
   service (``memq-<kind>``: ping, info and stats for ``memq status``) and
   :meth:`Component.serve` adds its endpoints, if any; it is ready once the
   server holds its subscriptions (:func:`memq.workers.runtime.bus.settle`);
4. ``stop()``: the service goes first (no new requests), then
   :meth:`Component.halt`;
5. ``reconnected()`` after NATS came back (default: nothing).

``checks()`` are the kind's readiness checks (:mod:`memq.workers.runtime.readiness`)
over its running parts; ``/readyz`` runs them.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar, final

from faststream.nats import NatsRouter
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.micro import add_service
from nats.micro.service import Service

from memq.workers import VERSION
from memq.workers.runtime import bus, readiness
from memq.workers.runtime.resources import Need, Resources
from memq.workers.settings import Settings


@dataclass
class Live:
    """What every running component has: the process's connection and its JetStream context."""

    nc: NATS
    js: JetStreamContext


L = TypeVar("L", bound=Live, covariant=True)


class NotOpened(RuntimeError):
    """A component's running parts were used before ``open()`` made them."""


class Component(ABC, Generic[L]):
    """One worker kind inside a process; see the module doc."""

    KIND: ClassVar[str]  # its name in runtime.kinds.KINDS; also its metrics' and dead letters' label
    DESCRIPTION: ClassVar[str]  # what it does, in one line (its NATS micro service's, in `memq status`)
    NEEDS: ClassVar[frozenset[Need]] = frozenset()
    # True: start() leaves work in the background (the indexing worker
    # prepares its index) and the kind sets `ready` once it is done.
    PREPARES: ClassVar[bool] = False

    def __init__(self, settings: Settings):
        self.settings = settings
        self.nc: NATS | None = None  # None until open(): the health monitor tests it
        self.service: Service | None = None  # registered by start()
        self._live: L | None = None
        self.ready = asyncio.Event()  # set once started (PREPARES: once prepared)

    @property
    def live(self) -> L:
        """The running parts, which ``open()`` made."""
        if self._live is None:
            raise NotOpened(f"the {self.KIND} worker is used before open()")
        return self._live

    # --- what a kind writes ---------------------------------------------------

    def router(self) -> NatsRouter:
        return NatsRouter()

    @abstractmethod
    async def build(self, nc: NATS, resources: Resources) -> L:
        """The kind's running parts, from the connection and the shared resources."""

    async def run(self) -> None:
        """Start the hot path (before the service registers)."""

    async def serve(self, service: Service) -> None:
        """Add the service's endpoints (none: the service only answers ping, info and stats)."""

    async def halt(self) -> None:
        """Stop the hot path (after the service stopped); safe after a cut-short start."""

    async def reconnected(self) -> None:
        """NATS came back after an outage."""

    def service_options(self) -> dict:
        """Options of the micro service beyond its name (queue group, metadata)."""
        return {}

    def checks(self) -> dict[str, readiness.Check]:
        """The readiness checks, by name; each reads the running parts when it runs."""
        return {"nats": readiness.nats(lambda: self.nc)}

    # --- the lifecycle the process drives (final: a kind writes the hooks above) ---

    @final
    async def open(self, nc: NATS, resources: Resources) -> None:
        self.nc = nc
        self._live = await self.build(nc, resources)

    @final
    async def start(self) -> None:
        await self.run()
        self.service = await add_service(
            self.live.nc,
            name=f"memq-{self.KIND}",
            version=VERSION,
            description=self.DESCRIPTION,
            **self.service_options(),
        )
        await self.serve(self.service)
        await bus.settle(self.live.nc)  # "ready" means a request finds the endpoints
        if not self.PREPARES:
            self.ready.set()

    @final
    async def stop(self) -> None:
        service, self.service = self.service, None
        if service is not None:
            await service.stop()
        await self.halt()
