"""Fixtures of the fault suite; all opt-in (nothing autouse).

Servers a test kills are its own (``own_postgres``, ``own_redis``,
``own_weaviate``): the session servers of tests/conftest.py are shared with
other tests. As there, a missing server skips, and fails with CI=true.
``stack`` builds the worker processes of a test and stops them after it.

When a test fails, the logs of the servers it owned and of its worker
processes are copied (server data directories are removed at teardown, and
pytest keeps only its last few temporary directories) into
``memq-kept-logs-*`` under the temporary directory; the report names the
copies and shows the servers' log tails.
"""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import Postgres, Redis, Server, Weaviate, running

from .stack import Stack

KEPT_LOG_LINES = 80  # of each server's kept log, shown in the failure report
OWNED_SERVERS = pytest.StashKey[list]()  # servers a test owns (their logs are kept if it fails)
LOG_DIRS = pytest.StashKey[list]()  # worker log directories, ditto


def _owned(request: pytest.FixtureRequest, server: Server) -> Server:
    request.node.stash.setdefault(OWNED_SERVERS, []).append(server)
    return server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    servers = [s for s in item.stash.get(OWNED_SERVERS, []) if s.log_path.exists()]
    log_dirs = [d for d in item.stash.get(LOG_DIRS, []) if d.is_dir()]
    if not servers and not log_dirs:
        return
    kept_dir = Path(tempfile.mkdtemp(prefix=f"memq-kept-logs-{re.sub(r'[^A-Za-z0-9_.-]', '_', item.name)}-"))
    for server in servers:
        kept = kept_dir / server.log_path.name
        shutil.copyfile(server.log_path, kept)
        report.sections.append((f"{server.name} log, kept at {kept}", server.log_tail(KEPT_LOG_LINES)))
    for d in log_dirs:
        shutil.copytree(d, kept_dir / "workers", dirs_exist_ok=True)
    if log_dirs:
        report.sections.append(("worker logs", f"kept in {kept_dir / 'workers'}"))


@pytest.fixture
def own_postgres(request: pytest.FixtureRequest) -> Iterator[Postgres]:
    with running(Postgres) as pg:
        yield _owned(request, pg)


@pytest.fixture
def own_redis(request: pytest.FixtureRequest) -> Iterator[Redis]:
    with running(Redis) as r:
        yield _owned(request, r)


@pytest.fixture
def own_weaviate(request: pytest.FixtureRequest) -> Iterator[Weaviate]:
    with running(Weaviate) as w:
        yield _owned(request, w)


def overrides(tmp_path: Path, nats_url: str, db_url: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Settings for a fault test: short redelivery and retry delays, so a
    killed worker's messages come back within seconds, not minutes."""
    base: dict[str, Any] = {
        "data_dir": str(tmp_path),
        "nats": {"url": nats_url},
        "database": {"url": db_url},
        "persistence": {"ack_wait_s": 3, "retry_delays_s": [0.2, 0.5, 1.0]},
        "indexing": {
            "backend": "embedded",
            "ack_wait_s": 5,
            "retry_delays_s": [0.2, 0.5, 1.0],
            "batch_wait_s": 0.05,
            "local": {"threads": 1},  # two cores, many processes
        },
    }
    return _merge(base, extra or {})


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest):
    """``stack(nats_url, db_url, extra)``: a :class:`Stack` (no worker started
    yet), stopped when the test ends, before the servers it uses: a finalizer
    added during the test runs ahead of every fixture's teardown."""

    def make(nats_url: str, db_url: str, extra: dict[str, Any] | None = None) -> Stack:
        logs = tmp_path / "logs"
        logs.mkdir(exist_ok=True)
        if logs not in request.node.stash.setdefault(LOG_DIRS, []):
            request.node.stash[LOG_DIRS].append(logs)
        made = Stack(overrides(tmp_path, nats_url, db_url, extra), logs)
        request.node.addfinalizer(made.stop)
        return made

    return make
