"""Google ADK's session and memory services on memq (``pip install memq[adk]``).

An ADK agent keeps its code and its ``Runner``; only the services change::

    memq = await MemoryClient.connect("nats://127.0.0.1:4222", app="my_app")
    runner = Runner(
        app_name="my_app", agent=agent,
        session_service=MemqSessionService(memq), memory_service=MemqMemoryService(memq),
    )

:class:`MemqSessionService` behaves as ADK's ``DatabaseSessionService``
(tests/integration/test_adapter_adk.py runs the same checks on both): state
keys are scoped by prefix (none = the session, ``user:`` = every session of
the user, ``app:`` = the whole app, ``temp:`` = this invocation only, never
stored), sessions come back with the merged state, and appending to a session
that another writer has appended to since it was loaded raises
``StaleSessionError``, whichever process that writer runs in: the append is
published with the stream sequence the session was loaded at, and JetStream
refuses it if the session has moved on (``expect_seq``,
:class:`~memq.contracts.errors.Conflict`).

Sessions that do not exist mean what they mean to ADK: appending to one
(never created, or deleted) raises ``SessionNotFoundError``, memq's
``create=False``, decided by the same ``expect_seq`` (a delete moves the
session's last sequence) or, for a session this service did not load, by
reading it; deleting one is a no-op (``missing_ok=True``).

A memq client speaks for one app (its NATS identity). A service given one
client serves that app; given a mapping ``{app: client}`` or a factory
``app -> client`` (:data:`Clients`), or made with ``from_url``, it serves
every ``app_name`` ADK passes::

    sessions = MemqSessionService.from_url("nats://127.0.0.1:4222")  # a client per app, on first use
    memory = MemqMemoryService(sessions.client_for)  # the same connections
    ...
    await sessions.close()  # closes the clients it connected

Events are stored as memq events (:mod:`memq.contracts.adapters.adk_events`),
so memq's history, context, summaries and long-term memory see an ADK
conversation as they see any other; :class:`MemqMemoryService` searches that
long-term memory.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
import unicodedata
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event as AdkEvent
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig, ListSessionsResponse
from google.adk.sessions.session import Session
from google.genai import types
from typing_extensions import override

from memq.contracts.adapters.adk_events import from_memq, json_safe, persisted_delta, to_memq
from memq.contracts.client import MemoryClient
from memq.contracts.errors import Conflict, NotFound
from memq.contracts.queries import Consistency, FactView, SearchMode, SearchResult, SessionView
from memq.contracts.schemas import new_id

STALE_SESSION = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)  # DatabaseSessionService's words
USER_PREFIX = "user:"
MARKER_PREFIX = "memq:"
STATE_READS = 16  # list_sessions: state reads in flight at once
APPEND_TRIES = 8  # appends whose expect_seq only checkpoints, state sets or artifacts overtook

ClientFactory = Callable[[str], "MemoryClient | Awaitable[MemoryClient]"]
Clients = MemoryClient | Mapping[str, MemoryClient] | ClientFactory
"""What a service speaks through: one app's client, a client per app, or a
(sync or async) factory ``app -> MemoryClient`` called once per app, on first use."""


def _marker(seq: int) -> str:
    """A session's revision as ``Session._storage_update_marker`` holds it:
    the stream sequence of the session's last message (of any kind) when it
    was loaded or last appended to, the ``expect_seq`` of its next append."""
    return f"{MARKER_PREFIX}{seq}"


def _loaded_at(session: Session) -> int | None:
    """The sequence in the session's marker; None for a session this service
    did not load (made by hand, from list_sessions, or another service's)."""
    marker = session._storage_update_marker or ""
    seq = marker.removeprefix(MARKER_PREFIX)
    return int(seq) if marker.startswith(MARKER_PREFIX) and seq.isdigit() else None


class _ClientsByApp:
    """The :class:`MemoryClient` of each app a service speaks for (see :data:`Clients`)."""

    def __init__(self, clients: Clients, service: str, *, owns_made: bool = False):
        self.service = service
        self.one = clients if isinstance(clients, MemoryClient) else None
        self.mapping = clients if isinstance(clients, Mapping) else None
        self.factory: ClientFactory | None = None
        if not isinstance(clients, MemoryClient | Mapping):
            self.factory = clients
        if self.factory is not None and not callable(self.factory):
            raise TypeError(
                f"{service} takes a MemoryClient, a mapping app -> MemoryClient or a factory, "
                f"not {type(clients).__name__}"
            )
        self.owns_made = owns_made  # close() closes what the factory made (from_url)
        self._made: dict[str, asyncio.Future[MemoryClient]] = {}

    async def get(self, app: str) -> MemoryClient:
        if self.one is not None:
            if app != self.one.app:
                raise ValueError(
                    f"this {self.service} speaks for app {self.one.app!r}, not {app!r}: give it a "
                    f"MemoryClient per app (a mapping {{app: client}} or a factory app -> client), "
                    f"or make it with {self.service}.from_url(...)"
                )
            return self.one
        if self.mapping is not None:
            client = self.mapping.get(app)
            if client is None:
                raise ValueError(
                    f"this {self.service} has no MemoryClient for app {app!r} (it has "
                    f"{', '.join(map(repr, sorted(self.mapping))) or 'none'}): add one to its mapping, "
                    f"or give it a factory app -> client, or make it with {self.service}.from_url(...)"
                )
            return self._checked(client, app)
        made = self._made.get(app)
        if made is None:  # one connect per app, however many calls wait for it
            made = self._made[app] = asyncio.ensure_future(self._make(app))
        try:
            return await asyncio.shield(made)
        except Exception:
            if made.done() and self._made.get(app) is made:
                del self._made[app]  # a later call tries again
            raise

    async def _make(self, app: str) -> MemoryClient:
        assert self.factory is not None
        client = self.factory(app)
        if inspect.isawaitable(client):
            client = await client
        return self._checked(client, app)

    def _checked(self, client: MemoryClient, app: str) -> MemoryClient:
        if client.app != app:
            raise ValueError(f"the MemoryClient given to this {self.service} for app {app!r} is app {client.app!r}'s")
        return client

    async def close(self) -> None:
        made, self._made = self._made, {}
        if not self.owns_made:
            return
        for future in made.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                await future.result().close()
            else:
                future.cancel()


def _connecting(cls: type, servers: str | list[str], connect_options: dict[str, Any], **kwargs: Any) -> Any:
    """A ``cls`` service that connects a client per app on first use, and closes them."""

    async def connect(app: str) -> MemoryClient:
        return await MemoryClient.connect(servers, app=app, **connect_options)

    service = cls(connect, **kwargs)
    service._clients.owns_made = True
    return service


class MemqSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on memq.

    :param clients: one app's :class:`~memq.contracts.client.MemoryClient`,
        a mapping ``{app: client}``, or a factory ``app -> client`` (sync or
        async, called once per app on first use): see :data:`Clients`. The
        caller keeps ownership of the clients it gives (or its factory makes)
        and closes them. :meth:`from_url` makes a service that connects and
        closes its own.

    Reads are read-your-writes: a session read after an append sees it.
    Appends to one session are serialized in this process, and across
    processes by the broker: each is published with ``expect_seq``, the
    sequence the session object was loaded (or last appended) at. When
    JetStream refuses it, the session is read as of the sequence it reports:
    a newer event there makes the session stale (``StaleSessionError``, as
    ``DatabaseSessionService`` raises); only checkpoints, state sets or
    artifacts since (ADK's own services have none) and the append is made
    again after them.

    :param consistency: what a read sees. Default ``"any"``: every
        writer's acknowledged writes, as ADK's database service (two Runner
        replicas on one session see each other's appends at once). ``"own"``:
        this process's writes, and every writer's appends to the session up
        to this process's last one; with a client made with
        ``local_reads=LocalWindows()`` a ``get_session`` right after this
        service's own appends is then answered in the client, with no
        request (:mod:`memq.contracts.local`). A write by another process
        after that is found by the next append, which raises
        ``StaleSessionError`` as ADK's services do for a session changed
        since it was loaded; use it where one Runner serves a session at a time.
    """

    def __init__(self, clients: Clients, *, consistency: Consistency = "any"):
        self._clients = _ClientsByApp(clients, type(self).__name__)
        self.consistency: Consistency = consistency
        self.client = self._clients.one  # the one-client form's client, as before; None otherwise
        self._locks: weakref.WeakValueDictionary[tuple[str, str, str], asyncio.Lock] = weakref.WeakValueDictionary()

    @classmethod
    def from_url(cls, servers: str | list[str] = "nats://127.0.0.1:4222", **connect_options: Any) -> MemqSessionService:
        """A service for every app, connecting one client per app on first
        use with :meth:`MemoryClient.connect(servers, app=…, **connect_options)
        <memq.contracts.client.MemoryClient.connect>`; :meth:`close` closes them."""
        return _connecting(cls, servers, connect_options)

    async def client_for(self, app_name: str) -> MemoryClient:
        """The client this service speaks for ``app_name`` through (a
        factory, e.g. for :class:`MemqMemoryService`, to share its connections)."""
        return await self._clients.get(app_name)

    async def close(self) -> None:
        """Close the clients this service connected itself (:meth:`from_url`);
        those it was given stay open."""
        await self._clients.close()

    async def __aenter__(self) -> MemqSessionService:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _read_options(self) -> dict[str, Any]:
        """Options of every read this adapter makes: by default every
        writer's acknowledged writes are visible (two Runner replicas on one
        session see each other's appends), as with ADK's database service."""
        return {"consistency": self.consistency}

    @override
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        client = await self._clients.get(app_name)
        if session_id is not None and await self._view(client, user_id, session_id, num_recent_events=0) is not None:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        ref = await client.create_session(
            user_id, session_id or new_id(), state=json_safe(persisted_delta(state or {}))
        )
        # Read back: the reply merges the app's and the user's existing state.
        view = await self._view(client, user_id, ref.session, num_recent_events=0, min_seq=ref.seq)
        if view is None:  # deleted between the two calls
            raise SessionNotFoundError(f"Session {ref.session} not found.")
        session = self._session(view, events=[])
        session._storage_update_marker = _marker(ref.seq)
        return session

    @override
    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        client = await self._clients.get(app_name)
        filters: dict[str, Any] = {}
        if config is not None:
            if config.num_recent_events is not None:
                filters["num_recent_events"] = config.num_recent_events
            if config.after_timestamp:  # ADK keeps events at or after it; memq's `after` is strict
                filters["after"] = math.nextafter(config.after_timestamp, -math.inf)
        view = await self._view(client, user_id, session_id, events=True, **filters)
        if view is None:
            return None
        session = self._session(view, events=[from_memq(e.event) for e in view.events or ()])
        # The session's last message when its row was read (an event committed
        # while the filtered events were read may be newer: it is in them).
        session._storage_update_marker = _marker(max([view.last_seq, *(e.seq for e in view.events or ())]))
        return session

    @override
    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        client = await self._clients.get(app_name)
        infos = [info async for info in client.iter_sessions(user_id, **self._read_options())]
        reads = asyncio.Semaphore(STATE_READS)

        async def with_state(info: Any) -> Session | None:
            async with reads:
                try:
                    state = await client.get_state(info.user, info.session, **self._read_options())
                except NotFound:  # deleted meanwhile
                    return None
            return Session(
                id=info.session, app_name=app_name, user_id=info.user, state=state, last_update_time=info.updated_at
            )

        sessions = [s for s in await asyncio.gather(*map(with_state, infos)) if s is not None]
        # ADK's order: oldest update first, so the last one is the most recently active.
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    @override
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        client = await self._clients.get(app_name)
        # ADK's services delete a missing session without a word: so does this one.
        await client.delete_session(user_id, session_id, missing_ok=True)

    @override
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        client = await self._clients.get(app_name)
        state = await client.get_state(user_id, **self._read_options())
        return {k.removeprefix(USER_PREFIX): v for k, v in state.items() if k.startswith(USER_PREFIX)}

    @override
    async def append_event(self, session: Session, event: AdkEvent) -> AdkEvent:
        if event.partial:  # streamed chunks are never stored; the final event is
            return event
        client = await self._clients.get(session.app_name)
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        if event.actions.state_delta:
            event.actions.state_delta = json_safe(event.actions.state_delta)
        if not event.id:
            event.id = AdkEvent.new_id()
        key = (session.app_name, session.user_id, session.id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            loaded_at = _loaded_at(session)
            if loaded_at is None:
                loaded_at = await self._check_unloaded(client, session)
            seq = await self._append(client, session, event, loaded_at)
            session.last_update_time = event.timestamp
            session._storage_update_marker = _marker(seq)
        return self._commit_event_to_session(session, event)

    async def _append(self, client: MemoryClient, session: Session, event: AdkEvent, loaded_at: int) -> int:
        """Publish ``event`` if the session's last message is still the one
        at ``loaded_at``, or only checkpoints, state sets and artifacts came
        after it; its sequence. StaleSessionError if an event came after it."""
        stored, expect = to_memq(event), loaded_at
        for _ in range(APPEND_TRIES):
            try:
                return await client.append(session.user_id, session.id, stored, expect_seq=expect)
            except Conflict as exc:
                if exc.last_seq is None:
                    raise StaleSessionError(STALE_SESSION) from exc
                if exc.last_seq == 0:  # deleted, and purged from the stream
                    raise SessionNotFoundError(f"Session {session.id} not found.") from exc
                # Everything up to the sequence the broker has, committed and visible.
                newer = await self._view(client, session.user_id, session.id, after_seq=loaded_at, min_seq=exc.last_seq)
                if newer is None:
                    raise SessionNotFoundError(f"Session {session.id} not found.") from exc
                for e in newer.events or ():
                    if e.event.get("id") == event.id:  # this very event: a publish whose ack was lost
                        return e.seq
                if newer.events:
                    raise StaleSessionError(STALE_SESSION) from exc
                expect = exc.last_seq
        raise StaleSessionError(STALE_SESSION)

    async def _check_unloaded(self, client: MemoryClient, session: Session) -> int:
        """The stale check of a session this service did not load (no marker):
        stale if the stored session was updated after it and its newest event
        is not the session's; the sequence to append after."""
        stored = await self._view(client, session.user_id, session.id, num_recent_events=1)
        if stored is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        newest = stored.events[-1] if stored.events else None
        if stored.updated_at > session.last_update_time:
            newest_id = newest.event["id"] if newest else None
            if newest_id != (session.events[-1].id if session.events else None):
                raise StaleSessionError(STALE_SESSION)
        return max(stored.last_seq, newest.seq if newest else 0)

    async def _view(self, client: MemoryClient, user: str, session: str, **options: Any) -> SessionView | None:
        try:
            return await client.get_session(user, session, **{**self._read_options(), **options})
        except NotFound:
            return None

    def _session(self, view: SessionView, events: list[AdkEvent]) -> Session:
        return Session(
            id=view.session,
            app_name=view.app,
            user_id=view.user,
            state=view.state,
            events=events,
            last_update_time=view.updated_at,
        )


class MemqMemoryService(BaseMemoryService):
    """ADK's ``BaseMemoryService`` on memq's long-term memory: every stored
    event of a user is indexed as it is committed, and ``search_memory``
    searches all of that user's sessions. A search finds what was added
    before it: it waits (at most the client's ``wait_ms``) until the
    client's own writes, and the sessions given to
    ``add_session_to_memory``, are indexed.

    :param clients: the app's client, a mapping ``{app: client}`` or a
        factory ``app -> client`` (:data:`Clients`; e.g. a
        :class:`MemqSessionService`'s ``client_for``, to share its
        connections); the caller keeps ownership of them. :meth:`from_url`
        connects (and closes) its own.
    :param k: memories per search, 1..100. Default 10 (as ADK's in-memory service).
    :param mode: ``"hybrid"`` (default), ``"keyword"`` or ``"vector"``.
    :param ranking: ``"adk"`` (default): as ADK's ``InMemoryMemoryService``
        ranks, the memories that contain the most of the query's words
        first, then in the order they were added; memq's search picks the
        candidates (its best :data:`CANDIDATES` that relate to the query, so
        a memory related by meaning alone still comes, after the word
        matches). ``"memq"``: memq's own ranking (scores, speaker and time boosts).
    :param facts: also up to this many facts about the user that match the
        query (when the workers derive facts: ``facts.llm``), first, each a
        :class:`MemoryEntry` with ``author`` ``"memq:facts"``, the fact's
        statement as its text and ``custom_metadata`` ``{"kind": "fact",
        "fact_id", "valid_from", "sources": [{"session", "seq"}...]}``.
        Default 0: memories only, as ADK's own services answer.
    """

    def __init__(
        self,
        clients: Clients,
        *,
        k: int = 10,
        mode: SearchMode = "hybrid",
        ranking: Literal["adk", "memq"] = "adk",
        facts: int = 0,
    ):
        self._clients = _ClientsByApp(clients, type(self).__name__)
        self.client = self._clients.one  # the one-client form's client, as before; None otherwise
        self.k = k
        self.mode = mode
        self.ranking = ranking
        self.facts = facts
        # The newest event of the memq sessions added (another client may
        # have written them): searches wait for it as for the client's own writes.

    @classmethod
    def from_url(
        cls,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        *,
        k: int = 10,
        mode: SearchMode = "hybrid",
        ranking: Literal["adk", "memq"] = "adk",
        facts: int = 0,
        **connect_options: Any,
    ) -> MemqMemoryService:
        """A memory service for every app, connecting one client per app on
        first use (as :meth:`MemqSessionService.from_url`); :meth:`close` closes them."""
        return _connecting(cls, servers, connect_options, k=k, mode=mode, ranking=ranking, facts=facts)

    async def close(self) -> None:
        """Close the clients this service connected itself (:meth:`from_url`)."""
        await self._clients.close()

    async def __aenter__(self) -> MemqMemoryService:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @override
    async def add_session_to_memory(self, session: Session) -> None:
        """Make sure memory holds the session's events. Sessions that
        :class:`MemqSessionService` stores are in it already; those of another
        session service are copied in (their content, not their state), with
        their ids, so adding a session again adds nothing twice."""
        if (session._storage_update_marker or "").startswith(MARKER_PREFIX):
            return  # loaded from memq: every event is indexed as it is committed
        await self.add_events_to_memory(
            app_name=session.app_name, user_id=session.user_id, events=session.events, session_id=session.id
        )

    @override
    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[AdkEvent],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        client = await self._clients.get(app_name)
        kept = []
        for event in events:
            if event.content is None or not event.content.parts or event.partial:
                continue
            stored = to_memq(event.model_copy(update={"actions": event.actions.model_copy(update={"state_delta": {}})}))
            kept.append(stored)
        # Appending an event id again is a no-op (the stream's dedupe, then the store's).
        await client.append_many(user_id, session_id or f"memory-{user_id}", kept)

    @override
    async def search_memory(self, *, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        client = await self._clients.get(app_name)
        # "any": what every client stored for this user is indexed first (a
        # session that another process added to memory included).
        k = max(self.k, CANDIDATES) if self.ranking == "adk" else self.k
        found = await client.search(user_id, query, k=k, mode=self.mode, consistency="any")
        results = found.results if self.ranking == "memq" else by_words_matched(query, found.results)[: self.k]
        known = (await client.facts(user_id, query, limit=self.facts)).facts if self.facts else []
        return SearchMemoryResponse(
            memories=[_fact_entry(fact) for fact in known]
            + [
                MemoryEntry(
                    id=hit.event_id,
                    content=types.Content(
                        role="model" if hit.metadata.get("role") == "assistant" else "user",
                        parts=[types.Part(text=hit.content)],
                    ),
                    author=hit.author,
                    timestamp=_iso(hit.timestamp),
                    custom_metadata={"session_id": hit.session_id, "score": hit.score},
                )
                for hit in results
            ]
        )


def _fact_entry(fact: FactView) -> MemoryEntry:
    return MemoryEntry(
        id=fact.id,
        content=types.Content(role="user", parts=[types.Part(text=fact.statement)]),
        author="memq:facts",
        timestamp=_iso(fact.valid_from),
        custom_metadata={
            "kind": "fact",
            "fact_id": fact.id,
            "valid_from": fact.valid_from,
            "sources": [{"session": s.session, "seq": s.seq} for s in fact.sources],
        },
    )


CANDIDATES = 50  # memq results an "adk" ranking orders before keeping the best k
_WORD = re.compile(r"[^\W_]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFC", text).lower())


def by_words_matched(query: str, results: Sequence[SearchResult]) -> list[SearchResult]:
    """``results`` as ADK's in-memory service orders its matches: by how many
    of the query's words each contains (case-insensitive; a word of a script
    written without spaces, or any non-ASCII word, also inside a longer
    one), most first; equal counts in the order they were added."""
    asked = set(_words(query))

    def matched(r: SearchResult) -> int:
        text = unicodedata.normalize("NFC", r.content).lower()
        have = set(_words(text))
        return sum(1 for w in asked if w in have or (not w.isascii() and w in text))

    def added(r: SearchResult) -> tuple:
        return (r.timestamp, r.session_id, r.metadata.get("seq", 0), r.event_id)

    return sorted(results, key=lambda r: (-matched(r), added(r)))


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).isoformat()  # as ADK's own memory services format it
