"""Request/reply schemas of the query service (core NATS, in no stream).

A request goes to ``memq.v1.q.<app>.<op>`` (:func:`memq.contracts.subjects.request_subject`)
with a JSON body naming the same app; the reply is ``{"ok": true, "result": …}``
or ``{"ok": false, "error": {"code": …, "message": …}}`` (the envelope:
``memq.contracts.replies``). ``OPS`` names every op with its request and
reply models, for the client, the query worker and the exported schemas
alike. Every request may
carry ``min_seq`` (the sequence of the caller's last publish): it is answered
only once that sequence is committed (read-your-writes), or fails with
``not_committed`` after ``wait_ms``. With ``consistency="any"`` the service
also waits for the newest write any client had acknowledged in the read's
scope before the read began (it asks JetStream for the last sequence on the
user's subjects), so a read sees what other processes wrote.

Paging: ``session.get``, ``history`` and ``context`` answer a session of any
size, in pages that each fit the server's ``max_payload``. A reply whose
``next_cursor`` is set is partial: ask again with the same request and
``cursor`` = that ``next_cursor`` for the next page, until ``next_cursor`` is
None. The first page carries every field; a continuation page carries only
the next events (``context``: the next ``messages`` and, in memq's format,
the next ``context["window"]`` entries), its other fields are empty. Every
page of one read is bounded by what the first page saw, so events appended
meanwhile do not shift or repeat it. :class:`memq.contracts.client.MemoryClient`
follows the cursors itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memq.contracts.errors import Forbidden, InvalidRequest, NotCommitted, NotFound, Unavailable  # noqa: F401 - re-exported
from memq.contracts.schemas import AppId, Event, NoNul, SessionId, Timestamp, UserId

# The vocabularies a request names (memq.contracts.vocabulary, light for
# the CLI and the settings), re-exported.
from memq.contracts.vocabulary import (  # noqa: F401
    CONSISTENCIES,
    CONTEXT_FORMATS,
    SEARCH_MODES,
    STRATEGY_ALIASES,
    STRATEGY_KINDS,
    STRATEGY_NAMES,
    Consistency,
    ContextFormat,
    Role,
    SearchMode,
    SearchRole,
    StrategyKind,
    StrategyName,
)

QUERY_VERSION: Literal[1] = 1
MAX_PAGE = 500
MAX_K = 100


class Request(BaseModel):
    """What every op's request has: the scope it reads and when it may be answered."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = QUERY_VERSION
    app: AppId
    user: UserId
    min_seq: int | None = Field(default=None, ge=1, description="answer only once this sequence is committed")
    wait_ms: int = Field(default=2000, ge=0, le=30_000, description="longest wait for min_seq")
    consistency: Consistency | None = Field(
        default=None,  # "own"; unset, a request is read by services older than the field
        description=(
            "own (default): see the writes up to min_seq; any: also every write acknowledged before the read, "
            "by any client, in the read's scope (the user's subjects; an app-wide listing: the app's)"
        ),
    )


class StrategySpec(BaseModel):
    """A working-memory strategy, or an override of the app's default.
    Unset fields take the app's settings (defaults as in Hector's docs;
    the default kind is ``summary_buffer``). ``kind`` ``"none"`` (Hector's
    name) is read as ``"all"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: StrategyName | None = None
    window: int | None = Field(default=None, ge=1, le=100_000)
    turns: int | None = Field(default=None, ge=1, le=100_000)
    budget: int | None = Field(default=None, ge=1, le=10_000_000)
    preserve_recent: int | None = Field(default=None, ge=0, le=10_000)
    threshold: float | None = Field(default=None, gt=0, le=1)
    target: float | None = Field(default=None, gt=0, le=1)
    min_recent: int | None = Field(default=None, ge=0, le=10_000)
    recall_share: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="summary_buffer: budget share recalled memories may take before the summary and older messages",
    )

    @field_validator("kind")
    @classmethod
    def _canonical_kind(cls, kind: str | None) -> str | None:
        return STRATEGY_ALIASES.get(kind, kind) if kind is not None else None


class _EventFilters(BaseModel):
    """Filters on a session's events (``session.get``, ``history``).

    ``after``: only events whose own ``timestamp`` (unix seconds, set by the
    publisher) is strictly later; ``roles``: only events whose message has one
    of these roles (events without a message have no role and are left out).
    Empty/None: no filter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    after: Timestamp | None = Field(default=None, description="event timestamp > after (unix seconds)")
    # None rather than []: an unfiltered request's body (and cache key) stays as it was.
    roles: list[Role] | None = Field(default=None, max_length=4, description="message roles to keep")


class _Paged(BaseModel):
    """A read that may answer in pages (see the module doc)."""

    cursor: str | None = Field(
        default=None, max_length=512, description="next_cursor of the previous page; default: the first page"
    )


class SessionGet(_Paged, _EventFilters, Request):
    session: SessionId
    events: bool = False
    num_recent_events: int | None = Field(default=None, ge=0, le=100_000)
    after_seq: int | None = Field(default=None, ge=0)


class SessionsList(Request):
    user: UserId | None = None  # type: ignore[assignment]  # filter: any user of the app when unset
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    cursor: str | None = Field(default=None, max_length=512)


class StateGet(Request):
    session: SessionId | None = None


MAX_CARRIED = 64  # writes one read may carry
# Fields that say when a request may be answered, not what it asks for: a
# cache key and a paging cursor's fingerprint leave them out.
NOT_WHAT_IS_ASKED = frozenset({"v", "min_seq", "wait_ms", "consistency", "carried"})


class CarriedWrite(BaseModel):
    """One message the caller published to the session: an event it
    appended (``event``), or another kind (``kind`` only), which the read
    cannot apply without the commit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = Field(ge=1)
    kind: str = Field(default="event", max_length=32)
    event: Event | None = None


class Carried(BaseModel):
    """The caller's own recent writes, sent with a read so that the service
    need not wait for their commit: it answers from SQL at its commit floor
    plus these (:mod:`memq.workers.query.carried`), or waits as usual when
    that would not be exact. ``writes`` holds every message the caller
    published to the session after ``after``; ``user_seq`` is its newest
    message on the user's own subject (user state, user delete)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    after: int = Field(default=0, ge=0)
    writes: list[CarriedWrite] = Field(default_factory=list, max_length=MAX_CARRIED)
    user_seq: int = Field(default=0, ge=0)


class HistoryGet(_Paged, _EventFilters, Request):
    session: SessionId
    strategy: StrategySpec | None = None
    model: str | None = Field(default=None, max_length=128)
    carried: Carried | None = Field(default=None, description="the caller's writes not known to be committed")


class ContextGet(_Paged, Request):
    session: SessionId
    strategy: StrategySpec | None = None
    model: str | None = Field(default=None, max_length=128)
    format: ContextFormat = "memq"
    instruction: str | None = Field(default=None, max_length=200_000, description="template rendered from state")
    recall_limit: int = Field(default=20, ge=0, le=100)
    facts_limit: int = Field(
        default=0,
        ge=0,
        le=100,
        description="at most this many facts about the user (the fact worker's), those that relate to the "
        "last user message first, in a part of their own before recall; 0: none",
    )
    message: str | None = Field(
        default=None,
        max_length=200_000,
        description="a user message not stored yet: placed last, counted in the budget, used for recall",
    )
    carried: Carried | None = Field(default=None, description="the caller's writes not known to be committed")


class ArtifactsList(Request):
    session: SessionId


class ArtifactGet(Request):
    session: SessionId
    filename: NoNul = Field(min_length=1, max_length=1024)
    version: int | None = Field(default=None, ge=0, description="default: the latest")


class Search(Request):
    """Long-term memory search, always within one app and user.

    ``min_seq`` here waits for the *indexing* worker (search sees a write
    once it is indexed)."""

    query: str = Field(min_length=1, max_length=8192)
    session: SessionId | None = None
    mode: SearchMode = "hybrid"
    k: int = Field(default=10, ge=1, le=MAX_K)
    authors: list[str] = Field(default_factory=list, max_length=50)
    roles: list[SearchRole] = Field(default_factory=list, max_length=5)
    since: float | None = Field(default=None, description="timestamp >= since (unix seconds)")
    until: float | None = Field(default=None, description="timestamp < until (unix seconds)")
    alpha: float | None = Field(default=None, ge=0, le=1, description="hybrid: weight of the vector side")


FACT_ID_PATTERN = r"^[0-9a-f]{32}$"  # a digest (workers/memory/facts.py: fact_id)


class FactsGet(Request):
    """Facts about the user, current ones by default; with a ``query``, the
    facts that relate to it, best first: ``hybrid`` (the default) fuses
    keyword and vector scores as a search does, and keeps a fact that shares
    a word with the query or whose vector clears the relevance floor;
    ``keyword`` keeps those that share a word, ``vector`` those over the
    floor (an index without vectors answers by keyword, and ``mode`` in the
    reply says so). ``min_seq`` waits for the commit
    and then for the facts to be derived up to it (``wait_ms`` in all): the
    reply's ``behind`` says how many of the user's sessions still hold turns
    not derived when the wait ran out."""

    query: str | None = Field(default=None, min_length=1, max_length=8192)
    mode: SearchMode = "hybrid"
    include_invalid: bool = Field(default=False, description="also the facts a later one contradicted")
    limit: int = Field(default=20, ge=1, le=MAX_K)


class ProfileGet(Request):
    """The user's current facts grouped by the entities they name."""


class FactHistoryGet(Request):
    """Every revision of one fact of the user, oldest first."""

    fact_id: str = Field(pattern=FACT_ID_PATTERN, description="a fact's id, as a facts reply gives it")


# --- replies -------------------------------------------------------------------


class Reply(BaseModel):
    """The base of every op's reply (and the models in one): fields a newer service adds are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class StoredEvent(Reply):
    seq: int
    tokens: int = 0
    event: dict[str, Any]


class SessionInfo(Reply):
    app: str
    user: str
    session: str
    created_at: float
    updated_at: float
    last_seq: int


class SessionView(SessionInfo):
    """A session; ``events`` when asked for, oldest first, every one of them
    over as many pages as it takes (``next_cursor``; a continuation page's
    ``state`` is empty). ``truncated`` and ``events_total`` are deprecated:
    no read is cut any more, so they are always false and None."""

    state: dict[str, Any]
    events: list[StoredEvent] | None = None
    next_cursor: str | None = None
    truncated: bool = False  # deprecated: always False
    events_total: int | None = None  # deprecated: always None


class SessionsPage(Reply):
    sessions: list[SessionInfo]
    next_cursor: str | None = None


class StateView(Reply):
    state: dict[str, Any]


class HistoryView(Reply):
    """A session's events as a strategy keeps them; in pages when they do
    not fit one reply (``next_cursor``: a continuation page carries only
    ``strategy`` and the next ``events``)."""

    strategy: dict[str, Any]
    summary: str | None = None
    checkpoint_seq: int | None = None
    events: list[StoredEvent]
    tokens: int  # the events' tokens plus the summary's
    needs_summary: bool = False
    over_budget: bool = False  # tokens > strategy's budget: possible with all / buffer_window
    next_cursor: str | None = None
    # Set when the answer added uncommitted writes: everything up to it was
    # committed when it was read (the client forgets its carried writes up to it).
    committed_seq: int | None = None


class ContextView(Reply):
    """A model context. ``budget``, ``over_budget`` and ``note`` come in every
    format: a context is within its budget unless the strategy is ``all``
    or ``buffer_window`` (which do not count tokens) or the instruction alone
    exceeds it; ``note`` then says so in words. A checkpoint summary longer
    than the budget allows is cut to its newest part, and ``note`` says that.
    In pages when it does not fit one reply (``next_cursor``): a continuation
    page carries only the next ``messages`` and, in memq's format, the next
    ``context["window"]`` entries."""

    format: ContextFormat
    tokens: dict[str, int]  # per part: instruction, known (facts), recalled, summary, window, total
    messages: list[dict[str, Any]]
    context: dict[str, Any] | None = None  # memq's own format
    budget: int | None = None  # the strategy's token budget
    over_budget: bool = False  # tokens["total"] > budget
    note: str | None = None  # why it is over budget, or that the summary was cut to fit
    next_cursor: str | None = None
    committed_seq: int | None = None  # as in HistoryView


class ArtifactInfo(Reply):
    filename: str
    versions: int
    latest_seq: int
    mime_type: str
    size: int


class ArtifactsView(Reply):
    artifacts: list[ArtifactInfo]


class ArtifactView(Reply):
    filename: str
    version: int
    seq: int
    mime_type: str
    size: int
    sha256: str
    inline: bytes | None = None
    object: dict[str, Any] | None = None

    model_config = ConfigDict(extra="ignore", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")


class SearchResult(Reply):
    """Hector's SearchResult fields; ``metadata`` adds app, user, seq, role."""

    session_id: str
    event_id: str
    content: str
    author: str
    timestamp: float
    score: float
    metadata: dict[str, Any] = Field(default_factory=dict)


class SearchResults(Reply):
    results: list[SearchResult]  # best first
    mode: SearchMode  # what answered (see note)
    model: str | None = None  # the embedding model of the index
    note: str | None = None  # why the mode differs from the one asked for


class FactSource(Reply):
    """A turn a fact came from."""

    seq: int
    session: str
    event_id: str
    at: float  # the turn's timestamp


class FactView(Reply):
    """A fact about the user: true from ``valid_from`` until ``invalid_from``
    (None: still true), when the fact ``invalidated_by`` contradicted it."""

    id: str
    statement: str
    entities: list[str]
    sources: list[FactSource]
    valid_from: float
    invalid_from: float | None = None
    invalidated_by: str | None = None
    revision: int = 1
    score: float | None = None  # with a query: its keyword score


class FactsView(Reply):
    facts: list[FactView]  # best first with a query, else oldest first
    generation: str | None  # the fact generation read (None: no fact was ever derived)
    behind: int = 0  # the user's sessions with turns not derived yet (up to min_seq, when given)
    mode: SearchMode | None = None  # how a query was ranked (None: no query)
    note: str | None = None  # why the mode differs from the one asked for


class EntityFacts(Reply):
    entity: str  # "" for the facts that name none
    facts: list[FactView]


class ProfileView(Reply):
    entities: list[EntityFacts]  # in the order the entities were first known
    generation: str | None
    behind: int = 0


class FactRevision(Reply):
    kind: str  # added, merged, invalidated, sources_dropped, restored
    fact: FactView
    written_at: float


class FactHistoryView(Reply):
    revisions: list[FactRevision]  # oldest first
    generation: str | None


# --- the registry ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryOp:
    """One query op of the contract: what it is called (the last subject
    token), what it takes and what it answers. The client, the query worker,
    the JSON Schemas and the AsyncAPI document all read :data:`OPS`; facts
    only the worker needs (caching, SQL) live beside its handlers, keyed by
    these names."""

    name: str
    request: type[Request]
    reply: type[Reply]
    summary: str
    # Whose progress a request's ``min_seq`` waits for: the persistence
    # worker's commits (read-your-writes), or the indexing worker's.
    waits_for: Literal["persistence", "indexing"] = "persistence"


OPS: dict[str, QueryOp] = {
    op.name: op
    for op in (
        QueryOp("session.get", SessionGet, SessionView, "A session, its merged state and, when asked, its events."),
        QueryOp("sessions.list", SessionsList, SessionsPage, "A page of an app's sessions, of one user or of all."),
        QueryOp("state.get", StateGet, StateView, "The merged app, user and (with a session) session state."),
        QueryOp("history", HistoryGet, HistoryView, "A session's events as a working-memory strategy keeps them."),
        QueryOp(
            "context", ContextGet, ContextView, "A model context: instruction, recalled memories, summary, window."
        ),
        QueryOp("artifacts.list", ArtifactsList, ArtifactsView, "The artifacts of a session."),
        QueryOp("artifacts.get", ArtifactGet, ArtifactView, "One version of an artifact: inline bytes or an object."),
        QueryOp("search", Search, SearchResults, "Long-term memory search within one app and user.", "indexing"),
        QueryOp("facts", FactsGet, FactsView, "Facts about the user, derived from their turns; with a query, ranked."),
        QueryOp("facts.profile", ProfileGet, ProfileView, "The user's current facts, grouped by entity."),
        QueryOp("facts.history", FactHistoryGet, FactHistoryView, "Every revision of one fact about the user."),
    )
}
