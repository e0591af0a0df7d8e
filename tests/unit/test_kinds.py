"""One registry of worker kinds (memq.workers.runtime.kinds) drives the CLI and
the consumer gauges; each kind's component (memq.workers.runtime.component)
declares its readiness checks and the resources it needs."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter

import pytest

from memq.workers.cli import WorkerKind
from memq.workers.runtime.component import Component, NotOpened
from memq.workers.runtime.health import durable_of
from memq.workers.runtime.kinds import KINDS, Kind
from memq.workers.runtime.resources import Resources
from memq.workers.settings import Settings


def test_the_cli_offers_exactly_the_registered_kinds_in_start_order():
    assert [k.value for k in WorkerKind] == list(KINDS)


def test_health_takes_durables_from_the_registry():
    s = Settings()
    for name, kind in KINDS.items():
        assert durable_of(name, s) == kind.durable(s)


def test_a_kind_added_to_the_registry_has_no_durable_unless_it_says(monkeypatch):
    monkeypatch.setitem(KINDS, "probe", Kind("probe", "builtins:object"))
    assert durable_of("probe", Settings()) is None


def test_each_component_declares_its_checks_and_needs():
    s = Settings(database={"url": "inmemory"})
    declared = {
        name: (sorted(kind.make(s).checks()), sorted(kind.component_class().NEEDS)) for name, kind in KINDS.items()
    }
    assert declared == {
        "persistence": (["consumer", "database", "nats"], ["sql"]),
        "indexing": (["consumer", "index", "nats"], ["embedder", "index"]),
        "summarizer": (["database", "nats"], ["sql"]),
        "facts": (["database", "nats"], ["sql"]),
        "query": (["database", "nats", "service"], ["embedder", "index", "sql"]),
        "http": (["http", "nats"], []),
    }


async def test_a_check_of_an_unopened_component_fails_saying_why():
    component = KINDS["query"].make(Settings(database={"url": "inmemory"}))
    checks = component.checks()
    with pytest.raises(Exception, match="not connected to NATS"):
        await checks["nats"]()
    with pytest.raises(NotOpened, match="query worker is used before open"):
        await checks["database"]()


async def test_resources_make_only_what_a_component_declared(tmp_path):
    s = Settings(data_dir=tmp_path, database={"url": "inmemory"})
    resources = Resources(s, Counter(["sql"]))
    with pytest.raises(RuntimeError, match="declared that it needs 'index'"):
        resources.index  # noqa: B018
    with pytest.raises(RuntimeError, match="declared that it needs 'embedder'"):
        await resources.embedder()
    assert resources.engine is resources.engine  # one engine, made once
    await resources.close()


async def test_the_embedder_loads_once_however_many_ask_at_once(tmp_path, monkeypatch):
    from memq.workers.index import embedders

    loads: list[str] = []

    class Model:
        async def close(self) -> None:
            loads.append("closed")

    async def slow_open(settings):
        loads.append("loaded")
        await asyncio.sleep(0.05)
        return Model()

    monkeypatch.setattr(embedders, "open_embedder", slow_open)
    resources = Resources(Settings(data_dir=tmp_path), Counter(["embedder", "embedder"]))
    first, second = await asyncio.gather(resources.embedder(), resources.embedder())
    assert first is second and loads == ["loaded"]
    await resources.close()
    assert loads == ["loaded", "closed"]


async def test_an_index_and_embedder_handed_in_are_used_and_closed(tmp_path):
    closed: list[str] = []

    class Part:
        def __init__(self, name: str):
            self.name = name

        async def close(self) -> None:
            closed.append(self.name)

    index, embedder = Part("index"), Part("embedder")
    resources = Resources(Settings(data_dir=tmp_path), Counter(["index", "embedder"]), index=index, embedder=embedder)  # type: ignore[arg-type]
    assert resources.index is index and await resources.embedder() is embedder
    await resources.close()
    assert closed == ["embedder", "index"]


def test_every_component_is_built_from_settings_and_has_the_lifecycle():
    s = Settings(database={"url": "inmemory"})
    for name, kind in KINDS.items():
        cls = kind.component_class()
        assert issubclass(cls, Component) and cls.KIND == name
        for hook in ("open", "start", "stop"):
            assert inspect.iscoroutinefunction(getattr(cls, hook)), (name, hook)
        component = kind.make(s)
        assert component.router() is not None and component.nc is None  # nothing connects before start


def test_the_process_drives_the_lifecycle_and_no_kind_rewrites_it():
    # open/start/stop are the process's (typing.final, which mypy holds);
    # a kind writes the hooks they call.
    for name, kind in KINDS.items():
        cls = kind.component_class()
        for method in ("open", "start", "stop"):
            assert getattr(getattr(Component, method), "__final__", False), method
            assert all(method not in vars(c) for c in cls.__mro__ if c is not Component), (name, method)
        assert isinstance(cls.DESCRIPTION, str) and cls.DESCRIPTION, name
