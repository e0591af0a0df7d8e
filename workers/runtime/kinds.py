"""The worker kinds, in one registry: what a process can run.

Everything that differs by kind is here: the component that does the work
(imported only when the kind runs: the indexing kind loads an ML stack), the
readiness checks ``/readyz`` runs against it (by name, from
:mod:`memq.workers.runtime.readiness`), and the durable consumer it reads the event
log with, if any (for the consumer gauges). The process runtime
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `memq --help` lists the kinds: neither SQLAlchemy nor the settings
    from memq.workers.runtime.readiness import Check
    from memq.workers.settings import Settings


def _no_durable(settings: Settings) -> str | None:
    return None


@dataclass(frozen=True)
class Kind:
    name: str
    description: str
    component: str  # "module:Class"; the class takes (settings) and builds its router
    checks: tuple[str, ...]
    durable: Callable[[Settings], str | None] = field(default=_no_durable)
    uses_sql: bool = False  # needs the migrated database (migrations run once per process)

    def component_class(self) -> type:
        module, _, name = self.component.partition(":")
        return getattr(importlib.import_module(module), name)

    def make(self, settings: Settings) -> Any:
        return self.component_class()(settings)

    def readiness(self, worker: Any) -> dict[str, Check]:
        """The named checks of one started component of this kind."""
        from memq.workers.runtime import readiness

        return {name: readiness.CHECKS[name](worker) for name in self.checks}


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            "persistence",
            "commits the event log to SQL, the source of truth",
            "memq.workers.persistence.worker:PersistenceWorker",
            checks=("nats", "consumer", "database"),
            durable=lambda s: s.persistence.durable,
            uses_sql=True,
        ),
        Kind(
            "indexing",
            "embeds the event log into the long-term memory index",
            "memq.workers.indexing.worker:IndexingWorker",
            checks=("nats", "index", "consumer"),
            durable=lambda s: s.indexing.durable,
        ),
        Kind(
            "summarizer",
            "checkpoint summaries that keep long sessions within budget",
            "memq.workers.summarizer.worker:SummarizerWorker",
            checks=("nats", "database"),
            uses_sql=True,
        ),
        Kind(
            "query",
            "sessions, history, context and search over request/reply",
            "memq.workers.query.service:QueryWorker",
            checks=("nats", "service", "database"),
            uses_sql=True,
        ),
        Kind(
            "http",
            "REST over the query service and the event log, an API key per app",
            "memq.workers.http.gateway:HttpGateway",
            checks=("nats", "http"),
        ),
    )
}


def kind_of(worker: Any) -> Kind:
    """The kind a component belongs to (its class's ``KIND``)."""
    return KINDS[worker.KIND]
