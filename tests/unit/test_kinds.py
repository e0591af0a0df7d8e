"""One registry of worker kinds (memq.workers.runtime.kinds) drives the CLI, the
readiness checks and the consumer gauges; no module keeps its own list."""

from __future__ import annotations

import inspect

from memq.workers.cli import WorkerKind
from memq.workers.runtime import readiness
from memq.workers.runtime.health import checks_for, durable_of
from memq.workers.runtime.kinds import KINDS, Kind
from memq.workers.settings import Settings


def test_the_cli_offers_exactly_the_registered_kinds_in_start_order():
    assert [k.value for k in WorkerKind] == list(KINDS)


def test_health_takes_checks_and_durables_from_the_registry():
    s = Settings()
    for name, kind in KINDS.items():
        assert list(checks_for(name, object())) == list(kind.checks)
        assert set(kind.checks) <= set(readiness.CHECKS)
        assert durable_of(name, s) == kind.durable(s)


def test_a_kind_added_to_the_registry_is_checked_as_it_says(monkeypatch):
    class Probe:
        nc = None

    monkeypatch.setitem(KINDS, "probe", Kind("probe", "a test kind", "builtins:object", checks=("nats",)))
    assert list(checks_for("probe", Probe())) == ["nats"]
    assert durable_of("probe", Settings()) is None


def test_every_component_is_built_from_settings_and_has_the_lifecycle():
    s = Settings(database={"url": "inmemory"})
    for name, kind in KINDS.items():
        cls = kind.component_class()
        assert cls.KIND == name
        for hook in ("open", "start", "stop"):
            assert inspect.iscoroutinefunction(getattr(cls, hook)), (name, hook)
        component = kind.make(s)
        assert component.router() is not None and component.nc is None  # nothing connects before start
