"""The Prometheus metrics of every worker kind, in one registry per process.

``memq up`` runs every worker kind in one process: one registry, one
``/metrics`` (served by :mod:`memq.workers.runtime.health`), and the ``worker`` label tells
the kinds apart. Metrics are module-level, as prometheus_client intends, so
instrumenting a worker is one line at the place where the thing happens.

Counters and histograms move as work is done. The gauges of consumer lag and
DLQ depth are read from JetStream every ``metrics.refresh_s`` by
:class:`memq.workers.runtime.health.Monitor`, each worker for its own durable consumer.

Cache hit rate is a PromQL ratio::

    sum(rate(memq_cache_requests_total{result="hit"}[5m]))
      / sum(rate(memq_cache_requests_total[5m]))
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    platform_collector,
    process_collector,
)

# Our own registry rather than prometheus_client's global one: /metrics shows
# memq's metrics (and the process's), not whatever else a library registers.
REGISTRY = CollectorRegistry(auto_describe=True)
process_collector.ProcessCollector(registry=REGISTRY)
platform_collector.PlatformCollector(registry=REGISTRY)
gc_collector.GCCollector(registry=REGISTRY)

# Buckets, chosen from the measured cost of each step (docs/benchmarks; seconds unless said).
# Messages per fetched batch: persistence fetches up to 256, indexing 64.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# A SQL transaction of a batch: ~1 ms (a few rows, SQLite) to seconds (10k rows, PostgreSQL under load).
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# An embed call: one search query (~5 ms local) to a batch of 64 long turns (~3 s on 2 cores) or a slow endpoint.
EMBED_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# A summary: extractive in ms, an LLM in seconds to minutes.
SUMMARY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# A query: a local cache hit in ~0.1 ms, SQL in ms, a read-your-writes wait up to its wait_ms.
QUERY_BUCKETS = (0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

EVENTS_PROCESSED = Counter(
    "memq_events_processed",
    "Stream messages a worker finished with: ok (acked after its effect is durable), "
    "dead_lettered (sent to the DLQ, then acked), retried (nak'd while a dependency is down)",
    ["worker", "outcome"],
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "memq_batch_size", "Messages per fetched batch", ["worker"], buckets=BATCH_BUCKETS, registry=REGISTRY
)
COMMIT_SECONDS = Histogram(
    "memq_commit_seconds",
    "Time to make a batch durable: persistence = the SQL transaction; indexing = embed and upsert",
    ["worker"],
    buckets=COMMIT_BUCKETS,
    registry=REGISTRY,
)
DEAD_LETTERED = Counter(
    "memq_dead_lettered",
    "Messages sent to the dead-letter stream, by error code",
    ["worker", "code"],
    registry=REGISTRY,
)

SQUATTED_IDS = Counter(
    "memq_squatted_ids",
    "Internal publishes whose Nats-Msg-Id another message held first (JetStream answered a duplicate "
    "that was not this message): published again under a fresh id",
    ["publisher"],
    registry=REGISTRY,
)

CONSUMER_LAG = Gauge(
    "memq_consumer_lag",
    "Messages in the stream not yet delivered to the durable consumer (num_pending)",
    ["consumer", "stream"],
    registry=REGISTRY,
)
CONSUMER_ACK_PENDING = Gauge(
    "memq_consumer_ack_pending",
    "Messages delivered to the consumer and not yet acknowledged",
    ["consumer", "stream"],
    registry=REGISTRY,
)
CONSUMER_REDELIVERED = Gauge(
    "memq_consumer_redelivered",
    "Unacknowledged messages delivered more than once",
    ["consumer", "stream"],
    registry=REGISTRY,
)
CONSUMER_ACK_FLOOR = Gauge(
    "memq_consumer_ack_floor",
    "Stream sequence up to which every message is acknowledged",
    ["consumer", "stream"],
    registry=REGISTRY,
)
DLQ_MESSAGES = Gauge(
    "memq_dlq_messages",
    "Messages in the dead-letter stream, by the worker that gave up on them",
    ["worker"],
    registry=REGISTRY,
)

CACHE_REQUESTS = Counter(
    "memq_cache_requests", "Query cache lookups (one per cacheable request)", ["result"], registry=REGISTRY
)
CACHE_HIT = CACHE_REQUESTS.labels(result="hit")  # bound once: the hit path is the hottest one
CACHE_MISS = CACHE_REQUESTS.labels(result="miss")
CACHE_ERRORS = Counter(
    "memq_cache_errors", "Redis failures of the query cache (each one answered from SQL)", ["op"], registry=REGISTRY
)

RECALL_SKIPPED = Counter(
    "memq_recall_skipped",
    "Contexts answered without recall because the index was unavailable or too slow",
    ["reason"],
    registry=REGISTRY,
)

EMBED_SECONDS = Histogram(
    "memq_embed_seconds",
    "Time of one embed call (a batch of texts; indexing and search queries)",
    ["model"],
    buckets=EMBED_BUCKETS,
    registry=REGISTRY,
)
EMBED_TEXTS = Counter("memq_embed_texts", "Texts embedded", ["model"], registry=REGISTRY)
REBUILD_DOCS = Counter(
    "memq_rebuild_docs",
    "Docs this process embedded into a rebuilding index generation (its share of the fleet's rebuild)",
    registry=REGISTRY,
)

SUMMARY_SECONDS = Histogram(
    "memq_summary_seconds",
    "Time to fold a session into a checkpoint summary (successful folds)",
    ["summarizer"],
    buckets=SUMMARY_BUCKETS,
    registry=REGISTRY,
)
SUMMARIES = Counter(
    "memq_summaries",
    "Summarizer runs that were due: checkpoint (published), duplicate (another replica's), "
    "failed (retried later), busy (another replica holds the session)",
    ["outcome"],
    registry=REGISTRY,
)

QUERY_SECONDS = Histogram(
    "memq_query_seconds",
    "Time from a request's arrival to its reply, by op",
    ["op"],
    buckets=QUERY_BUCKETS,
    registry=REGISTRY,
)
QUERY_ERRORS = Counter(
    "memq_query_errors", "Requests answered with an error, by op and error code", ["op", "code"], registry=REGISTRY
)
QUERY_REPLIES_REFUSED = Counter(
    "memq_query_replies_refused",
    "Requests dropped unanswered: their reply subject was not the app's inbox (workers/query/reply_subjects.py)",
    ["op"],
    registry=REGISTRY,
)
QUERY_TAIL = Counter(
    "memq_query_tail_reads",
    "Reads with min_seq above the commit floor, by how they were answered: tail (from SQL plus the "
    "session's uncommitted messages in the stream) or wait (once committed: the tail needed SQL's rules)",
    ["outcome"],
    registry=REGISTRY,
)
QUERY_TAIL_READ = QUERY_TAIL.labels(outcome="tail")  # bound once: on every such read
QUERY_TAIL_WAIT = QUERY_TAIL.labels(outcome="wait")
SEARCH_UNINDEXED = Counter(
    "memq_search_unindexed",
    "Searches with min_seq above the indexing floor answered at once, from the index plus the caller's own "
    "messages it has not reached yet (workers/query/stream_unindexed.py)",
    registry=REGISTRY,
)

READY = Gauge(
    "memq_ready", "1 while a readiness check passes, 0 while it fails (see /readyz)", ["check"], registry=REGISTRY
)


FACT_LLM_CALLS = Counter(
    "memq_fact_llm_calls",
    "Calls the fact worker made to its LLM endpoint: extract or decide",
    ["call"],
    registry=REGISTRY,
)
FACT_LLM_TOKENS = Counter(
    "memq_fact_llm_tokens",
    "Tokens the fact worker's LLM endpoint reported: prompt or completion",
    ["direction"],
    registry=REGISTRY,
)
FACT_CHANGES = Counter(
    "memq_fact_changes",
    "Fact revisions written: added, merged, invalidated, sources_dropped, restored, removed",
    ["kind"],
    registry=REGISTRY,
)
FACT_BATCHES = Counter(
    "memq_fact_batches",
    "Session batches the fact worker finished: derived, dead_lettered, over_budget, failed (retried later)",
    ["outcome"],
    registry=REGISTRY,
)
FACT_SESSIONS_BEHIND = Gauge(
    "memq_fact_sessions_behind",
    "Sessions with turns not derived into the fact generation being filled (at the last sweep)",
    registry=REGISTRY,
)


def processed(worker: str, outcome: str, n: int = 1) -> None:
    EVENTS_PROCESSED.labels(worker, outcome).inc(n)


def embedded(model: str, texts: int, seconds: float) -> None:
    EMBED_SECONDS.labels(model).observe(seconds)
    EMBED_TEXTS.labels(model).inc(texts)


def set_consumer(name: str, stream: str, pending: int, ack_pending: int, redelivered: int, ack_floor: int) -> None:
    """A durable consumer's gauges on one events stream (each app's stream
    has its own consumer of each durable, and its own sequences)."""
    CONSUMER_LAG.labels(name, stream).set(pending)
    CONSUMER_ACK_PENDING.labels(name, stream).set(ack_pending)
    CONSUMER_REDELIVERED.labels(name, stream).set(redelivered)
    CONSUMER_ACK_FLOOR.labels(name, stream).set(ack_floor)


def dlq_depth_by_worker(subjects: dict[str, int], prefix: str) -> dict[str, int]:
    """``{"memq.v1.dlq.persistence": 3}`` → ``{"persistence": 3}`` (subjects outside ``prefix`` are left out)."""
    out: dict[str, int] = {}
    for subject, count in subjects.items():
        if subject.startswith(prefix):
            worker = subject[len(prefix) :]
            out[worker] = out.get(worker, 0) + count
    return out


_dlq_workers: set[str] = set()


def set_dlq(by_worker: dict[str, int]) -> None:
    """Set the DLQ gauges; a worker whose dead letters are all gone (replayed) drops to 0."""
    _dlq_workers.update(by_worker)
    for worker in _dlq_workers:
        DLQ_MESSAGES.labels(worker).set(by_worker.get(worker, 0))
