"""The worker kinds, in one registry: what a process can run.

Here: each kind's name, the component that does the work (a
:class:`~memq.workers.runtime.component.Component`, imported only when the
kind runs: the indexing kind loads an ML stack) and the durable consumer it
reads the event log with, if any (for the consumer gauges). What a kind does
(``DESCRIPTION``), what it needs (SQL, the index, the embedder) and its
readiness checks are the component's own: stated once, there. The process runtime
(:mod:`memq.workers.runtime.app`), the health monitor and the CLI take them from
here; none of them names a kind.

``KINDS`` is in start order: the kinds that write SQL and the index first,
the query worker (which reads them) next, the HTTP gateway (which
asks the query worker) last.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `memq --help` lists the kinds: neither SQLAlchemy nor the settings
    from memq.workers.runtime.component import Component, Live
    from memq.workers.settings import Settings


def _no_durable(settings: Settings) -> str | None:
    return None


@dataclass(frozen=True)
class Kind:
    name: str
    component: str  # "module:Class", a Component subclass taking (settings)
    durable: Callable[[Settings], str | None] = field(default=_no_durable)

    def component_class(self) -> type[Component[Live]]:
        module, _, name = self.component.partition(":")
        cls: type[Component[Live]] = getattr(importlib.import_module(module), name)
        return cls

    def make(self, settings: Settings) -> Component[Live]:
        return self.component_class()(settings)


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("persistence", "memq.workers.persistence.worker:PersistenceWorker", lambda s: s.persistence.durable),
        Kind("indexing", "memq.workers.indexing.worker:IndexingWorker", lambda s: s.indexing.durable),
        Kind("summarizer", "memq.workers.summarizer.worker:SummarizerWorker"),
        Kind("facts", "memq.workers.facts.worker:FactWorker"),
        Kind("query", "memq.workers.query.worker:QueryWorker"),
        Kind("http", "memq.workers.http.worker:HttpGateway"),
    )
}


def kind_of(component: Component[Live]) -> Kind:
    """The kind a component belongs to (its class's ``KIND``)."""
    return KINDS[component.KIND]
