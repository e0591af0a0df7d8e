"""The OpenAI Agents SDK's session on memq (``pip install memq[openai-agents]``).

:class:`MemqSession` implements the SDK's ``Session`` protocol
(``agents.memory.Session``): hand it to ``Runner.run`` and each turn's input
items are stored as memq events, read back before the next turn::

    memq = await MemoryClient.connect("nats://127.0.0.1:4222", app="travel")
    session = MemqSession("trip-1", memq, user="ann")
    result = await Runner.run(agent, "Lisbon in May?", session=session)

Items read back equal to what was added (they are stored whole, see
:mod:`memq.contracts.adapters.openai_agents_items`), and memq's history,
context, summaries and long-term memory see their text, tool calls and tool
results. ``pop_item`` forgets the popped item's event everywhere
(:meth:`~memq.contracts.client.MemoryClient.forget_event`): memq's own
history, context and search no longer show it either. Reads
use ``consistency="any"``: every writer's acknowledged items are seen, so
two processes on one session see each other's items at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from agents.memory import SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit

from memq.contracts.adapters.openai_agents_items import event_of, items_of
from memq.contracts.client import MemoryClient
from memq.contracts.errors import Conflict, NotFound
from memq.contracts.queries import Consistency, StoredEvent

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

T = TypeVar("T")
POP_TRIES = 16  # pops refused because another writer's message landed first
MAX_WINDOW = 100_000  # the most events a read may ask for by count (SessionGet.num_recent_events); beyond: all


class MemqSession:
    """One memq session as an OpenAI Agents SDK session.

    :param session_id: the SDK's session id, memq's session id.
    :param client: the app's :class:`~memq.contracts.client.MemoryClient`
        (the caller keeps ownership of it).
    :param user: the memq user the session belongs to (memq scopes sessions,
        search and memory by app and user; the SDK has no user).
    :param session_settings: the SDK's ``SessionSettings`` (or a dict):
        ``limit`` is the default of :meth:`get_items`. Default: no limit.
    :param consistency: what a read sees. Default ``"any"``: every writer's
        acknowledged items. ``"own"``: this process's, and every writer's
        up to this process's last append; with a client made with
        ``local_reads=LocalWindows()``, ``get_items`` right after this
        session's own ``add_items`` is then answered in the client
        (:mod:`memq.contracts.local`). For a session one process serves at a time.
    """

    def __init__(
        self,
        session_id: str,
        client: MemoryClient,
        *,
        user: str,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        consistency: Consistency = "any",
    ):
        self.session_id = session_id
        self.consistency: Consistency = consistency
        self.client = client
        self.user = user
        self.session_settings: SessionSettings | None = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first; with ``limit`` (or the
        settings' limit) the newest ``limit`` of them. A negative limit means
        all (as ``SQLiteSession``), 0 none."""
        limit = resolve_session_limit(limit, self.session_settings)
        if limit == 0:
            return []
        kept, _ = await self._tail(limit if limit is not None and limit > 0 else None)
        return [item for _, item in kept]  # type: ignore[misc]  # dicts: the TypedDicts' runtime form

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items in order. A session is started by its first item.
        Every item is checked before the first is published: a bad one
        (not a dict, not JSON) stores none of them. A caller cancelled
        meanwhile gets CancelledError once every item is published (as for
        ``pop_item`` and ``clear_session``): never a batch cut short."""
        if not items:
            return
        events = [event_of(item, self.client.app) for item in items]
        await _settled(self.client.append_many(self.user, self.session_id, events))

    async def pop_item(self) -> TResponseInputItem | None:
        """Take back the newest item and return it; None for an empty session.

        The item's event is forgotten everywhere (memq's SQL, index, caches
        and stream), with the session's last sequence as read
        (``expect_seq``): if another writer added or popped meanwhile, the
        broker refuses the forget and the pop reads again, so two concurrent
        pops, in one process or two, never take back the same item."""
        popped = await _settled(self._pop())
        return popped  # type: ignore[return-value]  # a dict: the TypedDicts' runtime form

    async def _pop(self) -> dict[str, Any] | None:
        for _ in range(POP_TRIES):
            kept, last_seq = await self._tail(1)
            if not kept:
                return None
            event, item = kept[-1]
            try:
                # missing_ok: the read above is the check, and expect_seq keeps it true
                await self.client.forget_event(
                    self.user, self.session_id, event.seq, missing_ok=True, expect_seq=last_seq
                )
            except Conflict:
                continue  # the session moved on: read its newest item again
            return item
        raise Conflict(f"pop_item: session {self.session_id!r} kept changing under {POP_TRIES} tries")

    async def clear_session(self) -> None:
        """Delete the session everywhere (memq's delete: SQL, index, cache,
        stream). Clearing an empty or missing session is a no-op."""
        await _settled(self.client.delete_session(self.user, self.session_id, missing_ok=True))

    async def _tail(self, limit: int | None) -> tuple[list[tuple[StoredEvent, dict[str, Any]]], int]:
        """The newest ``limit`` items (all for None) with their
        events, and the session's last sequence. The window of events read
        doubles until it holds ``limit`` items or the whole session:
        events without an item (a state change, a checkpoint) take room in it."""
        window = limit if limit is not None and limit <= MAX_WINDOW else None
        while True:
            try:
                view = await self.client.get_session(
                    self.user, self.session_id, events=True, num_recent_events=window, consistency=self.consistency
                )
            except NotFound:  # never started, or cleared
                return [], 0
            events = view.events or []
            kept = items_of(events)
            last_seq = max([view.last_seq, *(e.seq for e in events)])
            if window is None or limit is None or len(kept) >= limit or len(events) < window:
                return (kept if limit is None else kept[-limit:]), last_seq
            window = window * 2 if window * 2 <= MAX_WINDOW else None


async def _settled(work: Awaitable[T]) -> T:
    """``work``'s result, run to its end even when the caller is cancelled
    meanwhile (then CancelledError, once it has ended): a write cut short
    would leave some of a batch published and the caller unable to know
    which, as the SDK's own sessions guard their writes."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()
