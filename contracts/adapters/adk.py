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
``StaleSessionError``. A memq client speaks for one app (its NATS identity),
so ``app_name`` must be the client's app.

Events are stored as memq events (:mod:`memq.contracts.adapters.adk_events`),
so memq's history, context, summaries and long-term memory see an ADK
conversation as they see any other; :class:`MemqMemoryService` searches that
long-term memory.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

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
from memq.contracts.errors import NotFound
from memq.contracts.queries import SearchMode, SessionView
from memq.contracts.schemas import new_id

STALE_SESSION = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)  # DatabaseSessionService's words
USER_PREFIX = "user:"
MARKER_PREFIX = "memq:"
STATE_READS = 16  # list_sessions: state reads in flight at once


def _marker(newest_event_seq: int | None) -> str:
    """A session's revision as ``Session._storage_update_marker`` holds it:
    the stream sequence of its newest event (checkpoints, artifacts and state
    sets leave it alone, as they leave ADK's update time alone)."""
    return f"{MARKER_PREFIX}{newest_event_seq or 0}"


class MemqSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on memq, through one app's
    :class:`~memq.contracts.client.MemoryClient` (the caller keeps ownership
    of it and closes it).

    Reads are read-your-writes: a session read after an append sees it.
    Appends to one session are serialized in this process; the stale-session
    check compares the newest stored event with the one the session was
    loaded at, as ``DatabaseSessionService`` does on databases without row
    locks (two processes appending at the same instant can both pass it).
    """

    def __init__(self, client: MemoryClient):
        self.client = client
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()

    def _app(self, app_name: str) -> None:
        if app_name != self.client.app:
            raise ValueError(
                f"this session service speaks for app {self.client.app!r}, not {app_name!r}: "
                "connect a MemoryClient for that app"
            )

    @override
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        self._app(app_name)
        if session_id is not None and await self._view(user_id, session_id, num_recent_events=0) is not None:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        ref = await self.client.create_session(
            user_id, session_id or new_id(), state=json_safe(persisted_delta(state or {}))
        )
        # Read back: the reply merges the app's and the user's existing state.
        view = await self._view(user_id, ref.session, num_recent_events=0, min_seq=ref.seq)
        if view is None:  # deleted between the two calls
            raise SessionNotFoundError(f"Session {ref.session} not found.")
        session = self._session(view, events=[])
        session._storage_update_marker = _marker(None)
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
        self._app(app_name)
        filters: dict[str, Any] = {}
        if config is not None:
            if config.num_recent_events is not None:
                filters["num_recent_events"] = config.num_recent_events
            if config.after_timestamp:  # ADK keeps events at or after it; memq's `after` is strict
                filters["after"] = math.nextafter(config.after_timestamp, -math.inf)
        # The revision first: an event appended between the two reads then
        # makes the next append stale, never a stale write go through.
        newest = None if not filters else await self._view(user_id, session_id, num_recent_events=1)
        view = await self._view(user_id, session_id, events=True, **filters)
        if view is None:
            return None
        if newest is None:
            newest = view
        session = self._session(view, events=[from_memq(e.event) for e in view.events or ()])
        session._storage_update_marker = _marker(newest.events[-1].seq if newest.events else None)
        return session

    @override
    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        self._app(app_name)
        infos = [info async for info in self.client.iter_sessions(user_id)]
        reads = asyncio.Semaphore(STATE_READS)

        async def with_state(info: Any) -> Session | None:
            async with reads:
                try:
                    state = await self.client.get_state(info.user, info.session)
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
        self._app(app_name)
        await self.client.delete_session(user_id, session_id)

    @override
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        self._app(app_name)
        state = await self.client.get_state(user_id)
        return {k.removeprefix(USER_PREFIX): v for k, v in state.items() if k.startswith(USER_PREFIX)}

    @override
    async def append_event(self, session: Session, event: AdkEvent) -> AdkEvent:
        if event.partial:  # streamed chunks are never stored; the final event is
            return event
        self._app(session.app_name)
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        if event.actions.state_delta:
            event.actions.state_delta = json_safe(event.actions.state_delta)
        if not event.id:
            event.id = AdkEvent.new_id()
        key = (session.user_id, session.id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            await self._check_not_stale(session)
            seq = await self.client.append(session.user_id, session.id, to_memq(event))
            session.last_update_time = event.timestamp
            session._storage_update_marker = _marker(seq)
        return self._commit_event_to_session(session, event)

    async def _check_not_stale(self, session: Session) -> None:
        stored = await self._view(session.user_id, session.id, num_recent_events=1)
        if stored is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        newest = stored.events[-1] if stored.events else None
        if session._storage_update_marker is not None:
            if session._storage_update_marker != _marker(newest.seq if newest else None):
                raise StaleSessionError(STALE_SESSION)
        elif stored.updated_at > session.last_update_time:
            # A session this service did not load (made by hand, or from
            # list_sessions): stale unless its newest event is the stored one.
            newest_id = newest.event["id"] if newest else None
            if newest_id != (session.events[-1].id if session.events else None):
                raise StaleSessionError(STALE_SESSION)

    async def _view(self, user: str, session: str, **options: Any) -> SessionView | None:
        try:
            return await self.client.get_session(user, session, **options)
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

    :param client: the app's client (the caller keeps ownership of it).
    :param k: memories per search, 1..100. Default 10 (as ADK's in-memory service).
    :param mode: ``"hybrid"`` (default), ``"keyword"`` or ``"vector"``.
    """

    def __init__(self, client: MemoryClient, *, k: int = 10, mode: SearchMode = "hybrid"):
        self.client = client
        self.k = k
        self.mode = mode
        # The newest event of the memq sessions added (another client may
        # have written them): searches wait for it as for the client's own writes.
        self._added_seq = 0

    @override
    async def add_session_to_memory(self, session: Session) -> None:
        """Make sure memory holds the session's events. Sessions that
        :class:`MemqSessionService` stores are in it already; those of another
        session service are copied in (their content, not their state), with
        their ids, so adding a session again adds nothing twice."""
        marker = session._storage_update_marker or ""
        if marker.startswith(MARKER_PREFIX):  # loaded from memq: every event is indexed as it is committed
            if (newest := marker[len(MARKER_PREFIX) :]).isdigit():
                self._added_seq = max(self._added_seq, int(newest))
            return
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
        if app_name != self.client.app:
            raise ValueError(f"this memory service speaks for app {self.client.app!r}, not {app_name!r}")
        kept = []
        for event in events:
            if event.content is None or not event.content.parts or event.partial:
                continue
            stored = to_memq(event.model_copy(update={"actions": event.actions.model_copy(update={"state_delta": {}})}))
            kept.append(stored)
        # Appending an event id again is a no-op (the stream's dedupe, then the store's).
        await self.client.append_many(user_id, session_id or f"memory-{user_id}", kept)

    @override
    async def search_memory(self, *, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        if app_name != self.client.app:
            raise ValueError(f"this memory service speaks for app {self.client.app!r}, not {app_name!r}")
        # None: search's default, the client's last write. A memq session
        # added above may end later (another client stored it): wait for that.
        last = self.client.last_seq or 0
        wait_for = self._added_seq if self.client.consistent and self._added_seq > last else None
        found = await self.client.search(user_id, query, k=self.k, mode=self.mode, min_seq=wait_for)
        return SearchMemoryResponse(
            memories=[
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
                for hit in found.results
            ]
        )


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).isoformat()  # as ADK's own memory services format it
