"""Fixtures of the fault suite; all opt-in (nothing autouse).

Servers a test kills are its own (``own_postgres``, ``own_redis``,
``own_weaviate``): the session servers of tests/conftest.py are shared with
other tests. As there, a missing server skips, and fails with CI=true.
``stack`` builds the worker processes of a test and stops them after it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import running
from services import Postgres, Redis, Weaviate

from .stack import Stack


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    with running(Postgres) as pg:
        yield pg


@pytest.fixture
def own_redis() -> Iterator[Redis]:
    with running(Redis) as r:
        yield r


@pytest.fixture
def own_weaviate() -> Iterator[Weaviate]:
    with running(Weaviate) as w:
        yield w


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
        made = Stack(overrides(tmp_path, nats_url, db_url, extra), logs)
        request.node.addfinalizer(made.stop)
        return made

    return make
