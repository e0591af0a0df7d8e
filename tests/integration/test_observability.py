"""Metrics, health probes and `memq status` against real workers on real NATS
and SQL: counters and histograms move by what was done, gauges follow the
consumers and the DLQ, /readyz follows a NATS outage, /healthz a blocked
loop, and `memq up` serves every worker kind from one registry."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import pytest
from helpers import NoticesHandled, make_settings, running, running_query, running_worker, wait_for
from prometheus_client.parser import text_string_to_metric_families
from services import free_port

from memq.contracts.client import MemoryClient
from memq.contracts.errors import NotFound
from memq.contracts.schemas import Event, Message, TextPart
from memq.contracts.subjects import events_subject, request_subject
from memq.workers.index.embedders.minilm import LocalEmbedder
from memq.workers.indexing.worker import IndexingWorker
from memq.workers.runtime.health import Monitor
from memq.workers.settings import LocalEmbedderSettings, MetricsSettings, Settings
from memq.workers.summarizer.worker import SummarizerWorker

MEMQ = str(Path(sys.prefix) / "bin" / "memq")
APP = "obs"
USER = "ada"
SESSION = "s1"

pytestmark = pytest.mark.timeout(300)


WORDS = "we talked about the trip to Lyon in May and the trains from Paris".split()


def said(i: int, words: int = 6) -> Event:
    body = " ".join(WORDS[j % len(WORDS)] for j in range(words))
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=f"turn {i}: {body}")]))


def metrics_settings(nats_url: str, db_url: str, tmp_path) -> Settings:
    s = make_settings(nats_url, db_url, tmp_path)
    s.metrics = MetricsSettings(port=0, refresh_s=0.2, check_timeout_s=2.0)
    return s


# --- HTTP ----------------------------------------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


async def probe(base: str, path: str) -> tuple[int, dict]:
    status, body = await asyncio.to_thread(_get, base + path)
    return status, json.loads(body)


async def until(base: str, path: str, status: int, timeout: float = 30.0) -> dict:
    """Poll ``path`` until it answers ``status``; return its body."""
    seen: dict = {}

    async def answers() -> bool:
        code, seen["body"] = await probe(base, path)
        return code == status

    await wait_for(answers, timeout=timeout, what=f"{path} {status} (last: {seen.get('body')})")
    return seen["body"]


class Scrape:
    """One /metrics scrape: ``scrape("memq_x_total", worker="persistence")``, 0 if absent."""

    def __init__(self, text: str):
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(base: str) -> Scrape:
    status, body = await asyncio.to_thread(_get, base + "/metrics")
    assert status == 200
    return Scrape(body.decode())


def delta(before: Scrape, after: Scrape):
    return lambda name, **labels: after(name, **labels) - before(name, **labels)


async def gauges_reach(base: str, expected: dict[tuple, float], timeout: float = 30.0) -> Scrape:
    """Until every ``(name, labels...)`` gauge has its value (they refresh every refresh_s)."""
    seen: dict = {}

    async def reached() -> bool:
        seen["scrape"] = s = await scrape(base)
        seen["values"] = {k: s(k[0], **dict(k[1:])) for k in expected}
        return seen["values"] == expected

    await wait_for(reached, timeout=timeout, what=f"gauges {expected} (last: {seen.get('values')})")
    return seen["scrape"]


@asynccontextmanager
async def monitored(settings: Settings, **workers):
    """The metrics/health server of this process, watching ``workers`` (kind=worker)."""
    monitor = Monitor(settings)
    await monitor.start(list(workers))
    for kind, worker in workers.items():
        monitor.watch(kind, worker)
    try:
        yield monitor
    finally:
        await monitor.stop()


# --- persistence and query --------------------------------------------------------


async def test_counters_and_histograms_move_by_what_was_done(nats_url, sqlite_url, tmp_path):
    s = metrics_settings(nats_url, sqlite_url, tmp_path)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        async with running_worker(s) as p, running_query(s) as q, monitored(s, persistence=p, query=q) as monitor:
            base = monitor.url
            ready = await until(base, "/readyz", 200)
            assert set(ready["checks"]) == {
                "persistence.nats",
                "persistence.consumer",
                "persistence.database",
                "query.nats",
                "query.service",
                "query.database",
            }
            assert (await probe(base, "/healthz"))[0] == 200
            before = await scrape(base)

            notices = NoticesHandled(q)
            async with await MemoryClient.connect(nats_url, app=APP) as client:
                written = set(await client.append_many(USER, SESSION, [said(i) for i in range(20)]))
                dead = await js.publish(events_subject(APP, USER, SESSION), b"not json")  # dead-lettered
                written.add(dead.seq)
                total = (await js.stream_info(s.streams.events)).state.last_seq
                good = total - 1
                await wait_for(lambda: _true(p.committed == good), what="every good message committed")

                after = await gauges_reach(
                    base,
                    {
                        ("memq_dlq_messages", ("worker", "persistence")): 1,
                        ("memq_consumer_lag", ("consumer", "memq-persistence"), ("stream", "MEMQ_EVENTS")): 0,
                        ("memq_consumer_ack_pending", ("consumer", "memq-persistence"), ("stream", "MEMQ_EVENTS")): 0,
                        ("memq_consumer_ack_floor", ("consumer", "memq-persistence"), ("stream", "MEMQ_EVENTS")): total,
                    },
                )
                d = delta(before, after)
                assert d("memq_events_processed_total", worker="persistence", outcome="ok") == good
                assert d("memq_events_processed_total", worker="persistence", outcome="dead_lettered") == 1
                assert d("memq_events_processed_total", worker="persistence", outcome="retried") == 0
                assert d("memq_dead_lettered_total", worker="persistence", code="invalid_message") == 1
                assert d("memq_batch_size_sum", worker="persistence") == total  # every message in one batch or another
                assert 1 <= d("memq_batch_size_count", worker="persistence") <= total
                assert d("memq_commit_seconds_count", worker="persistence") >= 1
                assert d("memq_commit_seconds_sum", worker="persistence") > 0
                assert after("memq_ready", check="persistence.database") == 1

                # Queries: the same request three times is one miss, then two hits.
                await client.get_session(USER, SESSION)
                await notices.wait(written)  # none left to drop the answers counted below
                before = await scrape(base)
                answers = [await client.history(USER, SESSION) for _ in range(3)]
                assert len({len(a.events) for a in answers}) == 1
                with pytest.raises(NotFound):
                    await client.history(USER, "no such session")
                invalid = await nc.request(request_subject(APP, "history"), b'{"v": 1}', timeout=5)
                assert json.loads(invalid.data)["error"]["code"] == "invalid_request"
                after = await scrape(base)
                d = delta(before, after)
                assert d("memq_cache_requests_total", result="hit") == 2
                assert d("memq_cache_requests_total", result="miss") == 2  # the first one, and the missing session
                assert d("memq_query_seconds_count", op="history") == 5
                assert d("memq_query_seconds_sum", op="history") > 0
                assert d("memq_query_errors_total", op="history", code="not_found") == 1
                assert d("memq_query_errors_total", op="history", code="invalid_request") == 1
    finally:
        await nc.close()


async def _true(value: bool) -> bool:
    return value


async def test_lag_gauge_counts_what_nobody_consumes_and_drops_to_zero(nats_url, sqlite_url, tmp_path):
    s = metrics_settings(nats_url, sqlite_url, tmp_path)
    lag = ("memq_consumer_lag", ("consumer", "memq-persistence"), ("stream", "MEMQ_EVENTS"))
    async with running_worker(s) as p, monitored(s, persistence=p) as monitor:
        base = monitor.url
        await until(base, "/readyz", 200)
        await p.live.consumer.stop()  # this replica stops fetching; it is still connected and watched
        body = await until(base, "/readyz", 503)
        assert body["failed"] == {"persistence.consumer": "the consumer is not fetching"}
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seqs = await client.append_many(USER, SESSION, [said(i) for i in range(15)])
        await gauges_reach(
            base, {lag: 15, ("memq_consumer_ack_floor", ("consumer", "memq-persistence"), ("stream", "MEMQ_EVENTS")): 0}
        )
        async with running_worker(s):  # another replica takes over
            await gauges_reach(
                base,
                {
                    lag: 0,
                    ("memq_consumer_ack_floor", ("consumer", "memq-persistence"), ("stream", "MEMQ_EVENTS")): seqs[-1],
                },
            )


async def test_readiness_follows_a_nats_outage(fresh_nats, sqlite_url, tmp_path):
    s = metrics_settings(fresh_nats.url, sqlite_url, tmp_path)
    async with running_worker(s) as p, running_query(s) as q, monitored(s, persistence=p, query=q) as monitor:
        base = monitor.url
        await until(base, "/readyz", 200)
        fresh_nats.kill()
        body = await until(base, "/readyz", 503)
        assert {"persistence.nats", "query.nats"} <= set(body["failed"]), body
        assert "not connected to NATS" in body["failed"]["persistence.nats"]
        assert body["checks"]["persistence.database"] == "ok"  # only what failed is named
        assert (await probe(base, "/healthz"))[0] == 200  # alive: waiting for NATS, no restart needed
        assert (await scrape(base))("memq_ready", check="query.nats") == 0
        await asyncio.to_thread(fresh_nats.restart)
        body = await until(base, "/readyz", 200)
        assert set(body["checks"].values()) == {"ok"}


async def test_liveness_fails_while_the_event_loop_is_blocked(tmp_path):
    s = Settings(data_dir=tmp_path, metrics={"port": 0, "liveness_timeout_s": 0.5, "refresh_s": 0.2})
    monitor = Monitor(s)
    await monitor.start(["query"])
    try:
        url = monitor.url + "/healthz"
        assert (await probe(monitor.url, "/healthz"))[0] == 200
        seen = {}

        def probe_during_the_block() -> None:
            time.sleep(1.0)
            seen["status"], seen["body"] = _get(url)

        prober = threading.Thread(target=probe_during_the_block)
        prober.start()
        # Blocks the event loop, as a CPU-bound bug would, until the probe is
        # answered (a fixed block let a loaded machine probe after it ended).
        prober.join()
        assert seen["status"] == 503 and json.loads(seen["body"])["status"] == "stalled"
        await until(monitor.url, "/healthz", 200)  # the loop runs again
    finally:
        await monitor.stop()


# --- indexing and summarizer ----------------------------------------------------------


async def test_indexing_reports_embed_latency(nats_url, sqlite_url, tmp_path):
    s = metrics_settings(nats_url, sqlite_url, tmp_path)
    s.indexing = type(s.indexing).model_validate(
        {**s.indexing.model_dump(), "backend": "embedded", "batch_wait_s": 0.05, "retry_delays_s": [0.2, 0.5]}
    )
    embedder = await asyncio.to_thread(LocalEmbedder, LocalEmbedderSettings())
    async with running_worker(s), running(IndexingWorker(s), embedder=embedder) as ix:
        await asyncio.wait_for(ix.ready.wait(), 60)
        async with monitored(s, indexing=ix) as monitor:
            base = monitor.url
            body = await until(base, "/readyz", 200)
            assert set(body["checks"]) == {"indexing.nats", "indexing.index", "indexing.consumer"}
            before = await scrape(base)
            docs = ix.indexed
            async with await MemoryClient.connect(nats_url, app=APP) as client:
                seqs = await client.append_many(USER, SESSION, [said(i, words=30) for i in range(6)])
            after = await gauges_reach(
                base,
                {
                    ("memq_consumer_lag", ("consumer", "memq-indexing"), ("stream", "MEMQ_EVENTS")): 0,
                    ("memq_consumer_ack_floor", ("consumer", "memq-indexing"), ("stream", "MEMQ_EVENTS")): seqs[-1],
                },
            )
            d = delta(before, after)
            assert ix.indexed - docs == 6
            assert d("memq_embed_texts_total", model=embedder.model) == 6
            assert d("memq_embed_seconds_count", model=embedder.model) >= 1
            assert d("memq_embed_seconds_sum", model=embedder.model) > 0
            assert d("memq_events_processed_total", worker="indexing", outcome="ok") == 6
            assert d("memq_batch_size_sum", worker="indexing") == 6
            assert d("memq_commit_seconds_count", worker="indexing") >= 1


async def test_summarizer_reports_summary_latency_and_outcomes(nats_url, sqlite_url, tmp_path):
    s = metrics_settings(nats_url, sqlite_url, tmp_path)
    s.memory = type(s.memory).model_validate({**s.memory.model_dump(), "strategy": "summary_buffer", "budget": 300})
    s.summarizer = type(s.summarizer).model_validate({**s.summarizer.model_dump(), "sweep_interval_s": 0.5})
    async with (
        running_worker(s),
        running_query(s),
        running(SummarizerWorker(s)) as sm,
        monitored(s, summarizer=sm) as monitor,
    ):
        base = monitor.url
        await until(base, "/readyz", 200)
        before = await scrape(base)
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append_many(USER, SESSION, [said(i, words=25) for i in range(30)])

            async def settled() -> bool:  # a checkpoint, and nothing more is due
                return sm.stats.checkpoints >= 1 and not (await client.history(USER, SESSION)).needs_summary

            await wait_for(settled, timeout=60, what="a checkpoint summary")
        await asyncio.sleep(0.5)  # a fold in flight finishes
        after = await scrape(base)
        d = delta(before, after)
        assert d("memq_summaries_total", outcome="checkpoint") == sm.stats.checkpoints
        assert d("memq_summaries_total", outcome="failed") == sm.stats.failures == 0
        assert d("memq_summary_seconds_count", summarizer="extractive") >= sm.stats.checkpoints
        assert d("memq_summary_seconds_sum", summarizer="extractive") > 0


# --- the command line ---------------------------------------------------------------------


def memq_env(settings: Settings | None, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    # the HTTP gateway of `memq up` on any free port: test runs side by side do not collide
    env.update(
        {"MEMQ_DATA_DIR": str(data_dir), "MEMQ_LOG_LEVEL": "WARNING", "COLUMNS": "200", "MEMQ_HTTP__PORT": "0", **extra}
    )
    if settings is not None:
        env.update(MEMQ_NATS__URL=settings.nats.url, MEMQ_DATABASE__URL=settings.database_url())
    return env


async def memq(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    env = memq_env(settings, settings.data_dir)
    return await asyncio.to_thread(subprocess.run, [MEMQ, *args], env=env, capture_output=True, text=True, timeout=120)


async def status_json(settings: Settings) -> dict:
    out = await memq(settings, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def test_memq_status_shows_lag_redeliveries_instances_and_dead_letters(nats_url, sqlite_url, tmp_path):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        async with running_query(s), await MemoryClient.connect(nats_url, app=APP) as client:
            async with running_worker(s) as p:
                await client.append_many(USER, SESSION, [said(i) for i in range(3)])
                await js.publish(events_subject(APP, USER, SESSION), b"not json")  # seq 4, dead-lettered
                await wait_for(lambda: _true(p.committed == 3), what="three events committed")
            # No persistence worker runs now: a hung replica holds two events,
            # delivered twice and never acked, and three more wait.
            assert await client.append_many(USER, SESSION, [said(i) for i in range(3, 5)]) == [5, 6]
            hung = await js.pull_subscribe_bind(consumer=s.persistence.durable, stream=s.streams.events)
            for msg in await hung.fetch(2, timeout=5):
                await msg.nak()
            again = await hung.fetch(2, timeout=5)
            assert [(m.metadata.sequence.stream, m.metadata.num_delivered) for m in again] == [(5, 2), (6, 2)]
            assert await client.append_many(USER, SESSION, [said(i) for i in range(5, 8)]) == [7, 8, 9]

            report = await status_json(s)
            consumers = {c["name"]: c for c in report["consumers"]}
            assert consumers["memq-persistence"] == {
                "name": "memq-persistence",
                "pending": 3,
                "ack_pending": 2,
                "redelivered": 2,
                "ack_floor": 4,
                "backlog": 5,  # pending + ack_pending: what waits
                "rate": 0.0,  # the held messages are never acked while it is sampled
                "eta_s": None,
            }
            assert report["last_seq"] == 9
            assert [i["name"] for i in report["instances"]] == ["memq-query"]
            assert report["instances"][0]["requests"] == 0
            assert report["dlq_messages"] == 1 and report["dlq_by_subject"] == {"memq.v1.dlq.persistence": 1}

            shown = await memq(s, "status")
            assert shown.returncode == 0, shown.stderr
            row = next(line for line in shown.stdout.splitlines() if "memq-persistence" in line)
            assert [int(n) for n in re.findall(r"\d+", row)] == [3, 2, 2, 4]  # lag, ack pending, redelivered, floor
            # the instances by kind (the service name without memq-: 80 columns)
            assert any(line.split()[:1] == ["query"] for line in shown.stdout.splitlines()), shown.stdout
            assert "dead letters in MEMQ_DLQ: 1" in shown.stdout and "memq.v1.dlq.persistence: 1" in shown.stdout

            for msg in again:  # the hung replica recovers; a new one takes the rest
                await msg.ack()
            await hung.unsubscribe()
            async with running_worker(s) as p2:
                await wait_for(lambda: _true(p2.committed == 3), what="the three waiting events committed")
                await client.history(USER, SESSION)  # one request: instances count it
                report = await status_json(s)
            consumers = {c["name"]: c for c in report["consumers"]}
            assert consumers["memq-persistence"] == {
                "name": "memq-persistence",
                "pending": 0,
                "ack_pending": 0,
                "redelivered": 0,
                "ack_floor": 9,
                "backlog": 0,
                "rate": 0.0,
                "eta_s": None,
            }
            assert sorted(i["name"] for i in report["instances"]) == ["memq-persistence", "memq-query"]
            assert {i["name"]: i["requests"] for i in report["instances"]}["memq-query"] == 1
            assert report["dlq_messages"] == 1
    finally:
        await nc.close()


async def test_memq_up_serves_every_worker_from_one_registry(tmp_path):
    port = free_port()
    data = tmp_path / "data"
    data.mkdir()
    log = tmp_path / "up.log"
    env = memq_env(None, data, MEMQ_METRICS__PORT=str(port), MEMQ_METRICS__REFRESH_S="0.3", MEMQ_LOG_LEVEL="INFO")
    with open(log, "ab") as out:
        proc = subprocess.Popen([MEMQ, "up", "--nats-port", "0"], env=env, stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    try:

        async def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return (await probe(base, "/readyz"))[0] == 200
            except OSError:  # not listening yet
                return False

        await wait_for(ready, timeout=120, what="memq up ready")
        checks = (await probe(base, "/readyz"))[1]["checks"]
        assert {name.split(".")[0] for name in checks} == {"persistence", "indexing", "summarizer", "query", "http"}
        url = (data / "run" / "nats.url").read_text().strip()
        async with await MemoryClient.connect(url, app=APP) as client:
            seqs = await client.append_many(USER, SESSION, [said(i) for i in range(4)])
            await client.history(USER, SESSION)
        await gauges_reach(
            base,
            {
                ("memq_consumer_ack_floor", ("consumer", "memq-persistence"), ("stream", "MEMQ_EVENTS")): seqs[-1],
                ("memq_consumer_ack_floor", ("consumer", "memq-indexing"), ("stream", "MEMQ_EVENTS")): seqs[-1],
                ("memq_events_processed_total", ("worker", "persistence"), ("outcome", "ok")): 4,
                ("memq_events_processed_total", ("worker", "indexing"), ("outcome", "ok")): 4,
            },
            timeout=60,
        )
        assert (await scrape(base))("memq_query_seconds_count", op="history") == 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = await asyncio.to_thread(proc.wait, 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    assert code == 0, log.read_text()
    with pytest.raises(OSError):  # the server stopped with the process
        _get(base + "/healthz")


async def test_a_taken_metrics_port_is_a_clear_error(nats_url, sqlite_url, tmp_path):
    import socket

    s = make_settings(nats_url, sqlite_url, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = memq_env(s, tmp_path, MEMQ_METRICS__PORT=str(port))
        out = await asyncio.to_thread(
            subprocess.run, [MEMQ, "worker", "query"], env=env, capture_output=True, text=True, timeout=60
        )
    assert out.returncode == 1
    # found before the worker starts, one line (memq.workers.cli.preflight)
    assert out.stderr.startswith(f"the metrics server cannot listen on 127.0.0.1:{port} (") and "in use" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "MEMQ_METRICS__PORT" in out.stderr
