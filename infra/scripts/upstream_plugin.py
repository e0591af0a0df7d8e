"""The pytest plugin that runs a framework's own session tests on memq
(loaded by infra/scripts/upstream_suites.py with ``-p upstream_plugin``; not
a test module of memq's suite).

Each test that runs gets a fresh real memq stack (tests/adapter_stack.py:
its own nats-server, SQLite, and the persistence, indexing and query
workers, in this process), and the framework's session is swapped for
memq's in the test module:

* ADK (``tests/unittests/sessions/test_session_service.py``): the module's
  ``get_session_service`` returns a :class:`MemqSessionService` whatever
  backend it is asked for, so the ``session_service`` fixture's IN_MEMORY
  case, and the tests that call ``get_session_service`` themselves, run on
  memq. The fixture's other cases (ADK's light-copy flag, database, SQLite)
  would run the same tests again. A test that builds ADK's
  ``DatabaseSessionService`` and uses only the service's public methods
  gets a MemqSessionService in its place too; one that reaches into a
  backend (its SQL schema, engine, table setup, mocks) or builds another of
  ADK's services tests that backend, not the interface.
* OpenAI Agents SDK (``tests/memory/test_session.py``,
  ``tests/memory/test_session_limit.py``): the module's ``SQLiteSession`` is
  a :class:`MemqSession` (one memq user and app per test; ``close()``, which
  SQLiteSession has, does nothing: the harness owns the client). Tests of
  SQLiteSession's own machinery (its SQLite file, locks, connections,
  corrupt rows written with sqlite3) are deselected, by name, with the reason.
  Tests that drive the session from another thread's event loop
  (``Runner.run_sync`` in ``asyncio.to_thread``, threads with loops of their
  own) run, marked as expected to fail (not strict: one may pass by luck):
  a MemoryClient, as every asyncio client (nats-py's), belongs to the loop
  that connected it, while SQLiteSession is blocking sqlite3 in threads.

The mode comes from ``MEMQ_UPSTREAM_MODE``: ``memq`` (default reads) or
``memq-local`` (the fast path: ``consistency="own"`` and a client made with
``local_reads=LocalWindows()``, memq.contracts.local). What was deselected,
and why, and what is expected to fail, is written as JSON to ``MEMQ_UPSTREAM_DESELECTED``.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

SUITE = os.environ.get("MEMQ_UPSTREAM_SUITE", "")
MODE = os.environ.get("MEMQ_UPSTREAM_MODE", "memq")
MODES = ("memq", "memq-local")
AGENTS_APP = "upstream"
AGENTS_USER = "upstream-user"

ADK_SERVICES = ("DatabaseSessionService", "SqliteSessionService", "InMemorySessionService", "VertexAiSessionService")
# What a test that builds DatabaseSessionService touches when it tests that backend's own machinery.
ADK_INTERNALS = (
    "_get_schema_classes",
    "database_session_factory",
    "prepare_tables",
    "_tables_created",
    "_db_schema_version",
    "_select_required_state",
    "database_session_service.",
    "mock.",
)

# The Agents SDK's tests of SQLiteSession itself (not of the Session protocol), by name.
AGENTS_DESELECTED = {
    "test_await_mutation_cancellation_hides_later_failure_without_loop_error": "SQLiteSession's private helper",
    "test_session_memory_disabled_parametrized": "uses no session",
    "test_session_settings_resolve": "uses no session (SessionSettings alone)",
    "test_sqlite_session_close_closes_worker_thread_connections": "SQLiteSession's connections per thread",
    "test_sqlite_session_closed_rejects_empty_add_items": "SQLiteSession.close(): MemqSession's client is the caller's",
    "test_sqlite_session_pop_item_skips_corrupt_most_recent": "writes corrupt rows into SQLiteSession's file",
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": (
        "writes corrupt rows into SQLiteSession's file"
    ),
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": "writes corrupt rows into SQLiteSession's file",
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": (
        "writes corrupt rows into SQLiteSession's file"
    ),
    "test_sqlite_session_file_lock_is_shared_across_instances": "SQLiteSession's per-file locks",
    "test_sqlite_session_failed_add_items_releases_write_lock": "probes SQLiteSession's file for its write lock",
    "test_sqlite_session_failed_clear_session_rolls_back": "drops SQLiteSession's tables to make a statement fail",
    "test_sqlite_session_failed_pop_item_releases_write_lock": "drops SQLiteSession's tables to make a statement fail",
    "test_sqlite_session_rollback_failure_evicts_connection": "SQLiteSession's connection cache",
    "test_sqlite_session_close_retries_quarantined_connection": "SQLiteSession's connection cache",
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": "SQLiteSession's commit internals",
}


OTHER_LOOP = "drives the session from another thread's event loop: a MemoryClient belongs to the loop that connected it"
AGENTS_OTHER_LOOP = ("test_sqlite_session_concurrent_access",)  # and every [run_sync] case


def agents_expected_failure(item: pytest.Item) -> str | None:
    """Why an Agents SDK test that runs on memq is expected to fail; None if it is not."""
    if "[run_sync]" in item.name or getattr(item, "originalname", item.name) in AGENTS_OTHER_LOOP:
        return OTHER_LOOP
    return None


def adk_reason(item: pytest.Item) -> str | None:
    """Why an ADK test does not run on memq; None if it does."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "session_service" in params:
        kind = getattr(params["session_service"], "name", str(params["session_service"]))
        if kind != "IN_MEMORY":
            return f"the same test on ADK's {kind} backend (memq takes the IN_MEMORY case's place)"
        return None
    source = inspect.getsource(item.function)  # type: ignore[attr-defined]
    if "get_session_service(" in source:
        return None
    built = [name for name in ADK_SERVICES if f"{name}(" in source]
    if built == ["DatabaseSessionService"] and not any(word in source for word in ADK_INTERNALS):
        return None  # only the public interface: a MemqSessionService takes its place
    if built:
        return f"builds ADK's {built[0]} itself: tests that backend, not the interface"
    return "uses no session service (ADK's own code)"


def agents_reason(item: pytest.Item) -> str | None:
    """Why an Agents SDK test does not run on memq; None if it does."""
    return AGENTS_DESELECTED.get(getattr(item, "originalname", item.name))


CHOSEN = pytest.StashKey[tuple[dict[str, str], dict[str, str]]]()  # (deselected, expected to fail): node id -> why


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason_of = adk_reason if SUITE == "adk" else agents_reason
    kept, dropped, why, expected = [], [], {}, {}
    for item in items:
        reason = reason_of(item)
        if reason is None:
            kept.append(item)
            failing = agents_expected_failure(item) if SUITE != "adk" else None
            if failing:
                item.add_marker(pytest.mark.xfail(reason=failing, strict=False))
                expected[item.nodeid] = failing
        else:
            dropped.append(item)
            why[item.nodeid] = reason
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    config.stash[CHOSEN] = (why, expected)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Write what was left out and what is expected to fail, once every
    selection (``-k`` included) is made."""
    why, expected = session.config.stash.get(CHOSEN, ({}, {}))
    running = {item.nodeid for item in session.items}
    out = os.environ.get("MEMQ_UPSTREAM_DESELECTED")
    if out:
        expected = {node: reason for node, reason in expected.items() if node in running}
        Path(out).write_text(json.dumps({"deselected": why, "expected_to_fail": expected}, indent=1))


def _client_options() -> dict[str, Any]:
    from memq.workers.memory.local import LocalWindows

    return {"local_reads": LocalWindows()} if MODE == "memq-local" else {}


def _consistency() -> Any:
    return "own" if MODE == "memq-local" else "any"


@pytest.fixture(autouse=True)
async def memq_in_place(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[None]:
    """A fresh memq stack for the test, and memq's session in the module."""
    from adapter_stack import memq_stack

    from memq.contracts.client import MemoryClient

    assert MODE in MODES, f"MEMQ_UPSTREAM_MODE={MODE!r}: one of {MODES}"
    data = tmp_path / "memq-data"
    data.mkdir()
    clients: list[MemoryClient] = []
    sessions: list[Any] = []  # the MemqSessions made in SQLiteSession's place

    async def connect(app: str) -> MemoryClient:
        client = await MemoryClient.connect(url, app=app, **_client_options())
        clients.append(client)
        return client

    async with memq_stack(data) as url:
        try:
            if SUITE == "adk":
                _adk_in_place(request.module, monkeypatch, connect)
            else:
                _agents_in_place(request.module, monkeypatch, await connect(AGENTS_APP), sessions)
            yield
            # else the test passed on the framework's own session, not memq's
            reached = clients if SUITE == "adk" else sessions
            assert reached, "the test never reached memq: no memq service or session was used"
        finally:
            for client in clients:
                await client.close()


def _adk_in_place(module: Any, monkeypatch: pytest.MonkeyPatch, connect: Any) -> None:
    from memq.contracts.adapters.adk import MemqSessionService

    def get_session_service(service_type: Any = None, tmp_path: Any = None) -> MemqSessionService:
        return MemqSessionService(connect, consistency=_consistency())  # a client per app, on first use

    class DatabaseInPlace(MemqSessionService):
        """Takes DatabaseSessionService's place (its URL is ignored). A subclass,
        so that the module's ``isinstance(service, DatabaseSessionService)`` holds
        for this one only."""

        def __init__(self, db_url: str = "", **kwargs: Any):
            super().__init__(connect, consistency=_consistency())

    monkeypatch.setattr(module, "get_session_service", get_session_service)
    monkeypatch.setattr(module, "DatabaseSessionService", DatabaseInPlace)


def _agents_in_place(module: Any, monkeypatch: pytest.MonkeyPatch, client: Any, made: list[Any]) -> None:
    from memq.contracts.adapters.openai_agents import MemqSession

    class UpstreamSession(MemqSession):
        def close(self) -> None:
            """SQLiteSession's close: nothing to do, the harness owns the client."""

    def sqlite_session(session_id: str, db_path: Any = ":memory:", session_settings: Any = None) -> MemqSession:
        made.append(session_id)  # before: a constructor that raises (bad settings) is memq's too
        return UpstreamSession(
            session_id, client, user=AGENTS_USER, session_settings=session_settings, consistency=_consistency()
        )

    if hasattr(module, "SQLiteSession"):
        monkeypatch.setattr(module, "SQLiteSession", sqlite_session)
