"""The pure parts of metrics and health: liveness and readiness decisions,
the HTTP router, DLQ labels, settings. The workers' metrics against real
services are in tests/integration/test_observability.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from wsgiref.util import setup_testing_defaults

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from memq.workers import metrics
from memq.workers.runtime.health import HealthState, HttpServer, Monitor, durable_of, make_app
from memq.workers.runtime.kinds import KINDS
from memq.workers.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state(**kw) -> tuple[HealthState, Clock]:
    clock = Clock()
    s = HealthState(liveness_timeout_s=kw.pop("timeout", 5.0), clock=clock)
    return s, clock


def test_liveness_fails_once_the_loop_has_not_stamped_for_too_long():
    s, clock = state(timeout=5.0)
    assert s.liveness()[0] == 200
    clock.now += 4.9
    assert s.liveness()[0] == 200
    clock.now += 0.2
    code, body = s.liveness()
    assert code == 503 and body["status"] == "stalled" and body["loop_age_s"] == pytest.approx(5.1)
    s.stamp()
    assert s.liveness()[0] == 200


def test_readiness_names_what_is_missing_or_failing():
    s, clock = state()
    code, body = s.readiness()
    assert code == 503 and body["failed"] == {"process": "no worker"}  # nothing runs yet

    s.expected = ("persistence", "query")
    s.results = {"persistence.nats": None, "persistence.database": None}  # query has not been checked yet
    code, body = s.readiness()
    assert code == 503 and body["failed"] == {"query": "starting"}

    s.results = {"persistence.nats": None, "persistence.database": None, "query.nats": None}
    code, body = s.readiness()
    assert code == 200 and body == {
        "status": "ready",
        "checks": {"persistence.nats": "ok", "persistence.database": "ok", "query.nats": "ok"},
    }

    s.results = {**s.results, "persistence.database": "OperationalError: connection refused"}
    code, body = s.readiness()
    assert code == 503 and body["failed"] == {"persistence.database": "OperationalError: connection refused"}
    assert body["checks"]["query.nats"] == "ok"

    s.results = {k: None for k in s.results}
    s.stopping = True  # shutting down: out of rotation at once
    code, body = s.readiness()
    assert code == 503 and body["failed"] == {"process": "stopping"}

    s.stopping = False
    clock.now += 60  # a stuck loop also stops refreshing the checks: not ready either
    code, body = s.readiness()
    assert code == 503 and list(body["failed"]) == ["loop"]


def call(app, path: str, method: str = "GET") -> tuple[str, dict, bytes]:
    environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": method}
    setup_testing_defaults(environ)
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = status, dict(headers)

    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


def test_router_serves_metrics_probes_and_nothing_else():
    s, clock = state()
    s.expected, s.results = ("query",), {"query.nats": None}
    app = make_app(s)
    status, headers, body = call(app, "/healthz")
    assert status == "200 OK" and headers["Content-Type"] == "application/json"
    assert json.loads(body)["status"] == "ok"
    status, _, body = call(app, "/readyz")
    assert status == "200 OK" and json.loads(body)["status"] == "ready"
    s.results = {"query.nats": "not connected to NATS"}
    status, _, body = call(app, "/readyz")
    assert status == "503 Service Unavailable" and json.loads(body)["failed"] == {"query.nats": "not connected to NATS"}
    clock.now += 10
    assert call(app, "/healthz")[0] == "503 Service Unavailable"

    metrics.processed("persistence", "ok", 0)  # make sure the family has a sample
    status, headers, body = call(app, "/metrics")
    assert status == "200 OK" and headers["Content-Type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    for name in (
        "memq_events_processed",
        "memq_batch_size",
        "memq_commit_seconds",
        "memq_consumer_lag",
        "memq_dlq_messages",
        "memq_cache_requests",
        "memq_embed_seconds",
        "memq_summary_seconds",
        "memq_query_seconds",
        "memq_query_errors",
        "process_cpu_seconds",
    ):
        assert name in names, name

    assert call(app, "/")[0] == "404 Not Found"
    assert call(app, "/readyz", "POST")[0] == "405 Method Not Allowed"


def test_http_server_answers_on_a_free_loopback_port():
    s, _ = state()
    server = HttpServer(make_app(s), "127.0.0.1", 0)
    try:
        assert server.port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5)
        assert e.value.code == 503 and "no worker" in e.value.read().decode()
    finally:
        server.close()


def test_dlq_depth_is_labelled_by_worker_and_drops_to_zero_when_replayed():
    subjects = {"memq.v1.dlq.persistence": 3, "memq.v1.dlq.indexing": 1, "other.subject": 9}
    assert metrics.dlq_depth_by_worker(subjects, "memq.v1.dlq.") == {"persistence": 3, "indexing": 1}
    metrics.set_dlq({"persistence": 3, "unit-test-worker": 2})
    assert metrics.REGISTRY.get_sample_value("memq_dlq_messages", {"worker": "unit-test-worker"}) == 2
    metrics.set_dlq({"persistence": 1})
    assert metrics.REGISTRY.get_sample_value("memq_dlq_messages", {"worker": "unit-test-worker"}) == 0
    assert metrics.REGISTRY.get_sample_value("memq_dlq_messages", {"worker": "persistence"}) == 1


def test_counters_move_by_what_they_are_given():
    def value() -> float:
        return metrics.REGISTRY.get_sample_value("memq_embed_texts_total", {"model": "unit:model"}) or 0.0

    before = value()
    metrics.embedded("unit:model", 5, 0.02)
    metrics.embedded("unit:model", 3, 0.5)
    assert value() == before + 8
    assert metrics.REGISTRY.get_sample_value("memq_embed_seconds_count", {"model": "unit:model"}) == 2
    assert metrics.REGISTRY.get_sample_value("memq_embed_seconds_bucket", {"model": "unit:model", "le": "0.025"}) == 1


def test_settings_from_the_environment(monkeypatch):
    assert Settings().metrics.port is None  # no server unless asked: replicas on one host never clash
    monkeypatch.setenv("MEMQ_METRICS__PORT", "9464")
    monkeypatch.setenv("MEMQ_METRICS__HOST", "0.0.0.0")
    s = Settings()
    assert (s.metrics.port, s.metrics.host) == (9464, "0.0.0.0")
    monkeypatch.setenv("MEMQ_METRICS__PORT", "70000")
    with pytest.raises(ValidationError):
        Settings()


async def test_monitor_without_a_port_serves_nothing():
    monitor = Monitor(Settings())
    await monitor.start(["persistence"])
    monitor.watch("persistence", object())
    assert monitor.server is None and monitor.url is None and monitor.workers == []
    await monitor.stop()


def test_checks_and_durables_per_worker_kind():
    s = Settings(database={"url": "inmemory"})
    names = {kind: sorted(KINDS[kind].make(s).checks()) for kind in ("persistence", "indexing", "summarizer", "query")}
    assert names == {
        "persistence": ["consumer", "database", "nats"],
        "indexing": ["consumer", "index", "nats"],
        "summarizer": ["database", "nats"],
        "query": ["database", "nats", "service"],
    }
    s = Settings()
    assert [durable_of(k, s) for k in ("persistence", "indexing", "summarizer", "query")] == [
        "memq-persistence",
        "memq-indexing",
        None,
        None,
    ]
