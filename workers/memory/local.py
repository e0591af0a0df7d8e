"""Session windows held in the client, and the reads they answer: pure, no I/O.

:mod:`memq.contracts.local` says why an answer from here is never stale;
this module keeps the windows and recomputes, from a held reply and the
events appended after it, exactly what the query worker would answer: the
new event as the persistence worker stores it (its JSON, its token count),
the merged state as the state rules apply it, and each strategy's cut.

A held ``history`` reply is the strategy's selection ``K``, a suffix of the
worker's window ``W`` (which the reply does not show). With one more event
``e``, the worker answers ``select(W + [e])``; this answers
``select(K + [e])``, which is the same whenever ``e`` answers no tool call
(or ``K`` is all of ``W``: ``K``'s own cut stays valid and every later cut lies inside
``K``: the strategies never cut further back when an event is added), and
``summary_buffer``'s ``needs_summary`` is taken only where ``K`` decides it
(see :func:`extend_history`). Everywhere else the read asks the service.
tests/unit/test_local_windows.py checks it against ``select(W + [e])`` over
random windows.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from memq.contracts import queries as q
from memq.contracts.schemas import (
    EventAppended,
    SessionCreated,
    StateSet,
    UserDeleted,
)
from memq.workers.memory.context import assemble, item_from_event, summary_message
from memq.workers.memory.state import APP_PREFIX, USER_PREFIX, split_delta
from memq.workers.memory.strategies import Item, Strategy, recent_cut, select
from memq.workers.memory.tokens import count_event, event_messages, message_tokens

MAX_SESSIONS = 1024  # windows held, least recently used dropped first
MAX_EVENTS = 256  # events held per window (a get_session's, a history's)
MAX_BYTES = 512 * 1024  # JSON bytes of the events held per window
MAX_HISTORIES = 16  # history and context reads (strategies) held per window
MAX_AGE_S = 30.0  # a window is read again from the service after this long


class Held(NamedTuple):
    """One held event, as its JSON: a window keeps bytes, not dicts, so the
    thousands of events a client holds are no work for Python's cyclic
    garbage collector (a tuple of atoms is untracked; each dict of an event
    would be scanned by every full collection), and a read's fresh copy is
    one parse (:func:`fresh`)."""

    seq: int
    tokens: int
    id: str
    json: bytes

    @classmethod
    def of(cls, e: q.StoredEvent) -> Held:
        return cls(e.seq, e.tokens, e.event.get("id", ""), orjson.dumps(e.event))


def fresh(events: Sequence[Held]) -> list[q.StoredEvent]:
    """Held events as a reply holds them: new dicts (callers may change what
    they are given, as they may a reply's), parsed in one pass of C."""
    data = orjson.loads(b"[" + b",".join(e.json for e in events) + b"]")
    return [_stored(e.seq, e.tokens, d) for e, d in zip(events, data, strict=True)]


_STORED_FIELDS = frozenset(q.StoredEvent.model_fields)
_new, _set = object.__new__, object.__setattr__


def _stored(seq: int, tokens: int, event: dict[str, Any]) -> q.StoredEvent:
    """``q.StoredEvent.model_construct(seq=, tokens=, event=)``, which sets
    these four attributes too, after a pass over the model's fields in Python
    that takes as long as parsing the event: a read of a long window builds
    one per event."""
    e = _new(q.StoredEvent)
    _set(e, "__dict__", {"seq": seq, "tokens": tokens, "event": event})
    _set(e, "__pydantic_fields_set__", _STORED_FIELDS)
    _set(e, "__pydantic_extra__", None)
    _set(e, "__pydantic_private__", None)
    return e


@dataclass
class HeldHistory:
    """One history reply and what extending it needs."""

    view: q.HistoryView  # without its events: they are ``events``
    strategy: Strategy
    items: list[Item]  # of events, as the worker counted them
    reserved: int  # the checkpoint summary's tokens
    events: list[Held]

    def reply(self) -> q.HistoryView:
        return self.view.model_copy(update={"events": fresh(self.events)})

    def extended(self, new: Held, item: Item, data: dict[str, Any]) -> HeldHistory | None:
        return _extended(self, new, item)

    def __len__(self) -> int:
        return len(self.events)


_ATOMS = (str, int, float, bool, type(None))


@dataclass
class HeldContext:
    """One context reply in OpenAI's format that is assembly over the window
    alone (no instruction, recall, facts nor pending message), and what
    extending it needs: :func:`assemble` run again over the held window and
    the new event gives the worker's answer over its whole window under the
    conditions of :meth:`extended`.
    """

    strategy: Strategy
    summary: str | None  # the checkpoint summary, whole (when known)
    known: bool  # the whole summary is known: the reply showed no cut of it
    shown: str | None  # the summary as the reply shows it (cut to fit, or whole)
    items: list[Item]  # the window, as the worker counted it
    messages: tuple[dict[str, Any], ...]  # the window's OpenAI messages
    counts: list[int]  # how many of them each item renders to
    nested: bool  # some message holds more than atoms (a tool call's arguments)
    whole: bool  # the window is the worker's whole window (K == W)
    tokens: dict[str, int]
    over_budget: bool
    note: str | None

    def reply(self) -> q.ContextView:
        head = [summary_message(self.shown)] if self.shown else []
        return q.ContextView.model_construct(
            format="openai",
            tokens=dict(self.tokens),
            messages=head + _copied(self.messages, self.nested),
            budget=self.strategy.budget,
            over_budget=self.over_budget,
            note=self.note,
        )

    def extended(self, new: Held, item: Item, data: dict[str, Any]) -> HeldContext | None:
        """This context with ``new`` appended, or None when what is held
        cannot decide it. As :func:`extend_history` argues for the window
        (the strategies never cut further back when an event is added; a tool
        result needs the whole window), and besides:

        - the newest items the strategy preserves (``min_recent``,
          ``preserve_recent``) fix the summary's room: they must lie inside
          what is held (a cut after its first item), unless it is the whole window;
        - a summary the reply showed cut cannot be cut again from here (its
          whole text is the worker's);
        - the summary's tokens must stay as they were: the window's cut was
          made with them reserved.
        """
        strategy, items = self.strategy, [*self.items, item]
        if item.result_ids and not self.whole:
            return None
        if strategy.keep_recent and not self.whole and recent_cut(items, strategy.keep_recent) == 0:
            return None
        if strategy.token_bounded and not self.known:
            return None
        built = assemble(
            history=items,
            events={},  # rendering is done from what is held
            strategy=strategy,
            summary=self.summary if strategy.token_bounded else self.shown,
            recall_limit=0,
        )
        if built.tokens.summary != self.tokens["summary"]:
            return None
        cut = len(items) - len(built.window)  # a window is a suffix
        added = event_messages(data)
        counts = [*self.counts, len(added)]
        kept = (*self.messages, *added)[sum(counts[:cut]) :]
        return HeldContext(
            strategy,
            self.summary,
            True,
            built.summary,
            list(built.window),
            kept,
            counts[cut:],
            (self.nested or _nested(added)) and _nested(kept),
            self.whole and cut == 0,
            built.tokens.to_dict(),
            built.over_budget,
            built.note,
        )

    def __len__(self) -> int:
        return len(self.items)


def _nested(messages: Sequence[dict[str, Any]]) -> bool:
    return not all(type(v) in _ATOMS for m in messages for v in m.values())


def _copied(messages: Sequence[dict[str, Any]], nested: bool) -> list[dict[str, Any]]:
    """Fresh copies of held messages. Flat ones (role and content strings,
    the usual ones) are copied in one pass in C, sharing their strings (a
    dict of atoms is no work for Python's collector either); a tool call's
    arguments are nested, and a shallow copy would share them: then the
    whole window is copied deep, through its JSON."""
    return orjson.loads(orjson.dumps(messages)) if nested else list(map(dict.copy, messages))


def hold_context(view: q.ContextView) -> HeldContext | None:
    """What extending a context needs, from its reply in memq's format (whose
    window entries carry the seqs and counts an OpenAI reply lacks), or None
    when it is not assembly over the window alone, or not counted for the
    default model (only the worker knows another model's counts)."""
    c = view.context
    if c is None or c.get("model") is not None or c.get("instruction") or c.get("known") or c.get("recalled"):
        return None
    try:
        strategy = Strategy.from_dict(c["strategy"])
    except (TypeError, ValueError):
        return None
    entries = c["window"]
    items = [item_from_event(en["seq"], en["event"], tokens=en["tokens"] or None) for en in entries]
    shown = c.get("summary")
    expected = message_tokens(summary_message(shown)) if shown else 0
    if view.tokens.get("summary") != expected or view.tokens.get("window") != sum(it.tokens for it in items):
        return None
    whole = _whole_window(strategy, bool(c.get("needs_summary")), len(items))
    rendered = [event_messages(en["event"]) for en in entries]
    flat = tuple(m for messages in rendered for m in messages)
    cut = bool(c.get("summary_cut"))
    return HeldContext(
        strategy,
        None if cut else shown,
        not cut,
        shown,
        items,
        flat,
        [len(messages) for messages in rendered],
        _nested(flat),
        whole,
        dict(view.tokens),
        view.over_budget,
        view.note,
    )


@dataclass
class _Window:
    n: int  # the session subject's last sequence this window is as of
    seeded_at: float
    info: q.SessionView | None = None  # the session and its merged state (events kept apart)
    events: list[Held] | None = None  # its newest events; None: not known
    complete: bool = False  # events holds every event of the session
    size: int = 0  # JSON bytes of events
    # history and context reads, by op and strategy (:func:`_read_key`)
    histories: dict[str, HeldHistory | HeldContext] = field(default_factory=dict)
    # Every event id this window has held, those cut off since included:
    # each was stored, and the worker keeps the first event of an id.
    ids: set[str] = field(default_factory=set)

    def saw(self, events: Iterable[Held]) -> None:
        self.ids.update(e.id for e in events)


def appended_event(seq: int, event: Any) -> tuple[Held, Item, dict[str, Any]]:
    """An appended event as the persistence worker stores it
    (``commit_plan.event_row``: its JSON, its count), its item, and its dict."""
    data = event.model_dump(mode="json", exclude_none=True)
    tokens = count_event(data)
    item = item_from_event(seq, data, tokens=tokens or None)
    return Held(seq, tokens, data.get("id", ""), orjson.dumps(data)), item, data


def item_of(e: q.StoredEvent) -> Item:
    # As the worker's window counts a stored event for the default model.
    return item_from_event(e.seq, e.event, tokens=e.tokens if e.tokens else None)


def extend_history(held: HeldHistory, new: q.StoredEvent) -> HeldHistory | None:
    """``held`` with ``new`` appended, as the worker would answer it, or None
    when what is held cannot decide it.

    - ``new`` may carry tool results only where ``K`` is the whole window
      (:func:`_whole`): a result whose call lies before ``K`` (or whose id a
      call before ``K`` used first) would move the worker's cut back, out of
      what is held.
    - ``summary_buffer``'s ``needs_summary`` depends on the whole window. With
      at least ``min_recent`` events held, a reply without it had kept the
      whole window (``K == W``; had it cut anything, the fold would reach
      into ``W``), so ``K + [e]`` decides; a reply with it keeps it whenever
      ``K + [e]`` says so (if ``K`` is a proper suffix, the fold still
      reaches into ``W``); otherwise it is not known here.
    """
    return _extended(held, Held.of(new), item_of(new))


def _extended(held: HeldHistory, new: Held, item: Item) -> HeldHistory | None:
    strategy, items = held.strategy, [*held.items, item]
    if item.result_ids and not _whole(held):
        return None
    selection = select(items, strategy, reserved=held.reserved)
    needs_summary = False
    if strategy.from_checkpoint:
        if len(held.items) < strategy.min_recent:
            return None
        if held.view.needs_summary and not selection.needs_summary:
            return None
        needs_summary = selection.needs_summary
    tokens = selection.tokens + held.reserved
    view = held.view.model_copy(
        update={
            "tokens": tokens,
            "over_budget": tokens > strategy.budget,
            "needs_summary": needs_summary,
            "next_cursor": None,
            "committed_seq": None,
        }
    )
    kept = [*held.events, new][len(items) - len(selection.items) :]  # a selection is a suffix
    return HeldHistory(view, strategy, list(selection.items), held.reserved, kept)


def _whole(held: HeldHistory) -> bool:
    return _whole_window(held.strategy, held.view.needs_summary, len(held.items))


def _whole_window(strategy: Strategy, needs_summary: bool, held: int) -> bool:
    """Is a held selection of ``held`` items the worker's whole window
    (``K == W``)? Always for ``all``; for ``summary_buffer`` when the reply
    asked for no summary with ``min_recent`` events held (see
    :func:`extend_history`). Otherwise it is not known, and a tool result may
    answer a call before ``K`` (the worker pairs a result with the *first*
    call of its id in ``W``)."""
    if strategy.rules.keeps_all:
        return True
    return strategy.from_checkpoint and not needs_summary and held >= strategy.min_recent


def hold_history(view: q.HistoryView) -> HeldHistory | None:
    """What extending ``view`` needs, or None when its counts are not the
    default model's (a deployment that counts for another model: the
    worker's items then differ from the stored counts, and only it knows)."""
    try:
        strategy = Strategy.from_dict(view.strategy)
    except (TypeError, ValueError):
        return None
    items = [item_of(e) for e in view.events]
    reserved = view.tokens - sum(it.tokens for it in items)
    expected = message_tokens(summary_message(view.summary)) if view.summary is not None else 0
    if reserved != expected:
        return None
    events = [Held.of(e) for e in view.events]
    return HeldHistory(view.model_copy(update={"events": []}), strategy, items, reserved, events)


def _read_key(op: str, req: q.HistoryGet | q.ContextGet) -> str:
    strategy = req.strategy.model_dump_json(exclude_none=True) if req.strategy is not None else ""
    return f"{op} {strategy}"


def _delta_scopes(delta: Any) -> tuple[bool, bool]:
    """Does ``delta`` set ``user:`` keys, ``app:`` keys?"""
    keys = list(delta or ())
    return any(k.startswith(USER_PREFIX) for k in keys), any(k.startswith(APP_PREFIX) for k in keys)


class LocalWindows:
    """The session windows one :class:`~memq.contracts.client.MemoryClient`
    holds (``MemoryClient(..., local_reads=LocalWindows())``): see
    :mod:`memq.contracts.local`.

    :param max_sessions: windows held; the least recently used is dropped
        first. Default 1024.
    :param max_events: events held per window (a get_session's newest, a
        history's selection); a read of more asks the service. Default 256.
    :param max_bytes: JSON bytes of those events per window. Default 512 KiB.
    :param max_age: seconds a window answers after the service's reply it
        grew from; then a read asks the service again (other clients'
        ``user:``/``app:`` state and user deletes are seen within it).
        Default 30.
    """

    def __init__(
        self,
        *,
        max_sessions: int = MAX_SESSIONS,
        max_events: int = MAX_EVENTS,
        max_bytes: int = MAX_BYTES,
        max_age: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_sessions = max_sessions
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.clock = clock
        self.app: str | None = None  # the app of the client they serve (bind)
        self._windows: OrderedDict[tuple[str, str], _Window] = OrderedDict()
        self._own: OrderedDict[tuple[str, str], int] = OrderedDict()  # this client's newest write per session
        # Bumped by every write that changes other sessions' reads (user
        # state, app state, a user delete): a read that began before it seeds nothing.
        self._generation = 0
        self.hits = 0  # reads answered here
        self.extended = 0  # appends that extended a window

    def __len__(self) -> int:
        return len(self._windows)

    def bind(self, app: str) -> None:
        if self.app is not None and self.app != app:
            raise ValueError(f"these LocalWindows serve app {self.app!r}'s client; give app {app!r}'s its own")
        self.app = app

    # --- writes -----------------------------------------------------------------

    def expect(self, user: str, session: str) -> int | None:
        window = self._current((user, session))
        return window.n if window is not None else None

    def appended(self, user: str, session: str, expect_seq: int | None, seq: int, event: Any) -> None:
        key = (user, session)
        self._wrote_session(key, seq)
        self._changes_others(key, user, event.actions.state_delta)
        window = self._windows.get(key)
        if window is None:
            return
        if expect_seq is None or expect_seq != window.n or event.id in window.ids:
            self.forget(user, session)  # an id held already: the worker keeps the first one
            return
        new, item, data = appended_event(seq, event)
        window.saw([new])
        if window.info is not None:
            window.info = window.info.model_copy(
                update={"updated_at": data["timestamp"], "last_seq": seq, "state": self._state(window.info, data)}
            )
        if window.events is not None:
            window.events.append(new)
            window.size += len(new.json)
            self._trim(window)
        for name, held in list(window.histories.items()):
            extended = held.extended(new, item, data)
            if extended is None or len(extended) > self.max_events:
                del window.histories[name]
            else:
                window.histories[name] = extended
        window.n = seq
        self.extended += 1
        self._windows.move_to_end(key)

    @staticmethod
    def _state(info: q.SessionView, new: dict[str, Any]) -> dict[str, Any]:
        """The merged state after the event's delta: it is the session's
        newest message, so each of its keys wins (higher seq, commit_plan)."""
        state = dict(info.state)
        scoped = split_delta((new.get("actions") or {}).get("state_delta") or {})
        state.update(scoped.session)
        state.update({USER_PREFIX + k: v for k, v in scoped.user.items()})
        state.update({APP_PREFIX + k: v for k, v in scoped.app.items()})
        return state

    def wrote(self, message: Any, seq: int | None = None) -> None:
        user, session = message.user, getattr(message, "session", None)
        if type(message) is UserDeleted or session is None:
            # The user's own subject: user:/app: state (StateSet) or a user delete.
            has_app = type(message) is StateSet and _delta_scopes([*message.delta, *(message.delete or ())])[1]
            self._drop(lambda key: has_app or key[0] == user)
            self._generation += 1
            return
        key = (user, session)
        if seq is not None:
            self._wrote_session(key, seq)
        self.forget(user, session)
        if type(message) is EventAppended:
            self._changes_others(key, user, message.event.actions.state_delta)
        elif type(message) is SessionCreated:
            self._changes_others(key, user, message.state)
        elif type(message) is StateSet:
            self._changes_others(key, user, [*message.delta, *(message.delete or ())])

    def forget(self, user: str, session: str) -> None:
        self._windows.pop((user, session), None)

    def _wrote_session(self, key: tuple[str, str], seq: int) -> None:
        self._own[key] = max(seq, self._own.pop(key, 0))
        while len(self._own) > 4 * self.max_sessions:
            self._own.popitem(last=False)

    def _changes_others(self, key: tuple[str, str], user: str, delta: Any) -> None:
        has_user, has_app = _delta_scopes(delta)
        if has_user or has_app:
            self._drop(lambda other: other != key and (has_app or other[0] == user))
            self._generation += 1

    def _drop(self, which: Callable[[tuple[str, str]], bool]) -> None:
        for key in [k for k in self._windows if which(k)]:
            del self._windows[key]

    # --- reads ------------------------------------------------------------------

    def _current(self, key: tuple[str, str]) -> _Window | None:
        window = self._windows.get(key)
        if window is not None and self.clock() - window.seeded_at > self.max_age:
            del self._windows[key]
            return None
        return window

    @staticmethod
    def _plain_session_get(req: q.SessionGet) -> bool:
        return req.cursor is None and req.after_seq is None and req.after is None and not req.roles

    @staticmethod
    def _plain_history(req: q.HistoryGet) -> bool:
        return req.cursor is None and req.after is None and not req.roles and req.model is None

    @staticmethod
    def _plain_context(req: q.ContextGet) -> bool:
        """Assembly over the window alone, in OpenAI's format (see :class:`HeldContext`)."""
        return (
            req.cursor is None
            and req.format == "openai"
            and req.model is None
            and not req.instruction
            and req.recall_limit == 0
            and req.facts_limit == 0
            and req.message is None
        )

    def _plain(self, op: str, req: Any) -> bool:
        if op == "session.get":
            return self._plain_session_get(req)
        if op == "history":
            return self._plain_history(req)
        return op == "context" and self._plain_context(req)

    def answer(self, op: str, request: Any) -> Any | None:
        if request.consistency == "any" or request.min_seq is not None:
            return None
        found: q.SessionView | q.HistoryView | q.ContextView | None
        if not self._plain(op, request):
            return None
        if op == "session.get":
            found = self._session_view(request)
        else:
            found = self._held_read(op, request)
        if found is not None:
            self.hits += 1
            self._windows.move_to_end((request.user, request.session))
        return found

    def _session_view(self, req: q.SessionGet) -> q.SessionView | None:
        window = self._current((req.user, req.session))
        if window is None or window.info is None:
            return None
        events: list[q.StoredEvent] = []
        wanted = req.num_recent_events
        if req.events or wanted is not None:
            held = window.events
            if held is None or not (window.complete or (wanted is not None and wanted <= len(held))):
                return None
            events = fresh(held if wanted is None else held[max(0, len(held) - wanted) :] if wanted else [])
        state = orjson.loads(orjson.dumps(window.info.state))
        return window.info.model_copy(update={"state": state, "events": events, "next_cursor": None})

    def _held_read(self, op: str, req: q.HistoryGet | q.ContextGet) -> q.HistoryView | q.ContextView | None:
        window = self._current((req.user, req.session))
        held = window.histories.get(_read_key(op, req)) if window is not None else None
        if held is None:
            return None
        return held.reply()

    def seeds(self, op: str, request: Any) -> Any | None:
        return self._generation if self._plain(op, request) else None

    def seed_format(self, op: str) -> str | None:
        """The format a seeding read of ``op`` asks for: a context is held from
        memq's format (its window entries carry the seqs and counts)."""
        return "memq" if op == "context" else None

    def seed(self, op: str, request: Any, reply: Any, min_seq: int, ticket: Any) -> None:
        if ticket is None or ticket != self._generation:
            return  # an own write that changes this read came meanwhile
        key = (request.user, request.session)
        own = self._own.get(key, 0)
        if op == "session.get":
            n = reply.last_seq
            if not 0 < n <= min_seq or own > n:
                self._windows.pop(key, None)  # older than what was just read: of no use
                return
            window = self._window(key, n)
            window.info = reply.model_copy(update={"events": None, "next_cursor": None})
            if request.events or request.num_recent_events is not None:
                events = [Held.of(e) for e in reply.events or ()]
                wanted = request.num_recent_events
                window.complete = wanted is None or len(events) < wanted
                window.events, window.size = events, sum(len(e.json) for e in events)
                window.saw(events)
                self._trim(window)
        else:  # history, context: as of this client's own newest write
            committed = reply.committed_seq
            if not own or min_seq < own or (committed is not None and committed < own):
                return
            held = hold_history(reply) if op == "history" else hold_context(reply)
            if held is None or len(held) > self.max_events:
                return
            window = self._window(key, own)
            window.histories[_read_key(op, request)] = held
            if isinstance(held, HeldHistory):
                window.saw(held.events)
            else:
                window.ids.update(en["event"].get("id", "") for en in reply.context["window"])
            while len(window.histories) > MAX_HISTORIES:
                del window.histories[next(iter(window.histories))]

    def _trim(self, window: _Window) -> None:
        """Drop a window's oldest events past its bounds."""
        events = window.events or []
        while events and (len(events) > self.max_events or window.size > self.max_bytes):
            window.size -= len(events.pop(0).json)
            window.complete = False

    def _window(self, key: tuple[str, str], n: int) -> _Window:
        """The window of ``key`` as of ``n``: the held one if it is, else a new one."""
        window = self._windows.pop(key, None)
        if window is None or window.n != n:
            window = _Window(n=n, seeded_at=self.clock())
        self._windows[key] = window
        while len(self._windows) > self.max_sessions:
            self._windows.popitem(last=False)
        return window
