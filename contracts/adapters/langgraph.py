"""LangGraph's long-term memory store on memq (``pip install memq[langgraph]``).

:class:`MemqStore` is a LangGraph ``BaseStore``: give it to a graph
(``compile(store=...)``, ``create_react_agent(..., store=...)``) and its
items live in memq, where memq's search, recall and deletes see them::

    memq = await MemoryClient.connect("nats://127.0.0.1:4222", app="my_app")
    store = MemqStore(memq)  # the namespace's first label is the memq user
    await store.aput(("alice", "memories"), "food", {"text": "Alice likes pizza"})
    await store.asearch(("alice", "memories"), query="what does alice eat")

How items map onto memq (docs/guide/adapters.md has the table):

- the store speaks for the client's app; the memq **user** of a namespace is
  its label at ``user_label`` (default 0: ``("alice", "memories")`` is
  alice's), or the fixed ``user=`` given to the store;
- each **item is one memq session** of that user, named
  ``langgraph.<n>.<label>...<label>.<key>`` (``n`` labels), so that a delete
  is memq's session delete: gone from SQL, the search index and caches,
  never recalled again;
- the value is the session's state key ``langgraph``, with its times;
- an indexed item's text (``index`` fields, default every string in the
  value) is the session's one event (role ``user``, author ``memory``), so
  memq indexes it: ``search`` with a query is memq's hybrid search over the
  user's items, behind its relevance floor, and memq's ``context`` recalls
  items in the user's chat sessions as any other memory;
- ``index=False`` (or nothing to index): the event holds the value and no
  message, so nothing is indexed.

Labels are matched as LangGraph's own stores match them: a search's
``namespace_prefix`` literally (``("*", "memories")`` is the user named
``*``, never every user: an app that builds namespaces from end users' ids
must not let one read the others'), ``list_namespaces``' conditions with
``*`` as a wildcard for any one label.

A put replaces the item: the old session is deleted and the new one written
(two publishes), so the old text is not found any more; ``created_at`` is
the time of the latest put, as in LangGraph's ``InMemoryStore``. Every read
sees what any client had acknowledged before it (``consistency="any"``):
read-your-writes, across processes too.

Facts: a namespace whose last label is ``facts_label`` (default
``"memq_facts"``: ``("alice", "memq_facts")``) holds the facts memq's fact
worker derived about its user, read-only. ``search`` there is memq's fact
search (hybrid, behind the relevance floor; without a query, the current
facts, oldest first) and ``get`` takes a fact's id; each item's value is
``{"statement", "entities", "valid_from", "sources"}``. A put there raises
``InvalidNamespaceError``: facts are derived from the user's turns, never
written. ``list_namespaces`` does not list it (it holds no items of the
store's own).

TTL: memq has no per-item expiry, so ``supports_ttl`` is False and a ``ttl``
raises ``NotImplementedError``. The app's session expiry
(``expiry.apps`` / ``expiry.session_ttl_s`` on the server) applies to items
as to every session of the app: an item not put again for that long is
deleted (reads do not refresh it).

The async methods run on the client's event loop (awaited on another loop,
they hand the work to the client's); the sync ones (what a graph run with
``invoke`` calls) hand the work to that loop and wait, so they work from any
other thread, never from the loop's own (``asyncio.InvalidStateError``, as
LangGraph's async stores raise). For sync code, :meth:`MemqStore.connect`
runs a client on a loop in a thread of its own::

    with MemqStore.connect("nats://127.0.0.1:4222", app="my_app") as store:
        graph = builder.compile(store=store)
        graph.invoke(...)
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, Self, TypeVar

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
    validate_op_namespace,
)

from memq.contracts.adapters.client_loop import ClientLoop
from memq.contracts.backoff import doubling
from memq.contracts.client import MemoryClient
from memq.contracts.errors import Conflict, InvalidRequest, NotFound
from memq.contracts.ids import MAX_ID_BYTES
from memq.contracts.queries import Consistency, FactView
from memq.contracts.schemas import Actions, Event, Message, TextPart

PREFIX = "langgraph"  # item sessions are named langgraph.<n>.<labels>.<key>
STATE_KEY = "langgraph"  # the item's record in its session's state
AUTHOR = "memory"  # the author of an item's event: search asks for it alone
SEARCH_K = 100  # hits asked of memq's search per user (its maximum)
PAGE = 500  # sessions per listing page (memq's maximum)
READS = 16  # item reads in flight at once, per search or listing
# Ops in flight at once per store, across concurrent calls: a burst (LangGraph's
# test_large_batches_async starts 3,000 at once) queues here instead of piling
# onto the query service until reads time out.
OPS_IN_FLIGHT = 32
PUT_TRIES = 8  # a put's delete-then-write, when other puts of the item come between
# Backoff between those tries, first and most (doubling, jittered): puts that
# keep meeting each other in lockstep would otherwise each cancel the other's
# write every round (a CI run saw eight concurrent puts all run out of tries).
PUT_BACKOFF = (0.005, 0.2)
FACTS_LABEL = "memq_facts"  # the last label of a namespace that reads the user's facts
T = TypeVar("T")


class ItemRef(NamedTuple):
    """Where an item lives in memq: its user and session."""

    namespace: tuple[str, ...]
    key: str
    user: str
    session: str


def session_of(namespace: tuple[str, ...], key: str) -> str:
    """The memq session id of an item (labels never hold ``.``, so the label
    count is enough to tell the labels from a key that does)."""
    session = ".".join((PREFIX, str(len(namespace)), *namespace, key))
    if len(session.encode("utf-8")) > MAX_ID_BYTES:
        raise ValueError(
            f"namespace {namespace} and key {key[:40]!r} are too long for memq: together "
            f"(as {PREFIX}.<n>.<labels>.<key>) they must fit in {MAX_ID_BYTES} bytes"
        )
    return session


def item_of(session: str) -> tuple[tuple[str, ...], str] | None:
    """The (namespace, key) of an item session, None for any other session."""
    head, _, rest = session.partition(".")
    count, _, rest = rest.partition(".")
    if head != PREFIX or not count.isdigit() or int(count) == 0:
        return None
    parts = rest.split(".")
    n = int(count)
    if len(parts) <= n or not all(parts[:n]):
        return None
    return tuple(parts[:n]), ".".join(parts[n:])


def matches(namespace: tuple[str, ...], condition: MatchCondition, wildcard: bool = True) -> bool:
    """LangGraph's prefix/suffix match; with ``wildcard`` (``list_namespaces``'
    match conditions) ``*`` matches any one label, without it (``search``'s
    ``namespace_prefix``) ``*`` is a label like any other, as in LangGraph's
    own stores."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        labels = namespace[: len(path)]
    elif condition.match_type == "suffix":
        labels = namespace[len(namespace) - len(path) :]
    else:
        raise ValueError(f"unsupported match type {condition.match_type!r}")
    return all((wildcard and p == "*") or p == label for p, label in zip(path, labels, strict=True))


def filter_matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """LangGraph's search filter: exact values (nested dicts and lists
    compared as JSON) and the operators ``$eq $ne $gt $gte $lt $lte``, on
    top-level keys or dotted paths."""
    return all(_compare(_at(value, k), want) for k, want in (filter or {}).items())


def _at(value: Mapping[str, Any], key: str) -> Any:
    """The value a filter key names: a top-level key, else a dotted path into
    nested objects (``"user.level"``), as LangGraph's SQL stores read it."""
    if key in value or "." not in key:
        return value.get(key)
    found: Any = value
    for part in key.split("."):
        if not isinstance(found, Mapping) or part not in found:
            return None
        found = found[part]
    return found


OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


def check_filter(filter: Any) -> None:
    """Refuse a filter with an operator LangGraph's stores do not have,
    before any item is read (with no item to compare, it would pass)."""
    if isinstance(filter, dict):
        for key, want in filter.items():
            if isinstance(key, str) and key.startswith("$") and key not in OPERATORS:
                raise ValueError(f"unsupported filter operator {key!r} (LangGraph's are $eq $ne $gt $gte $lt $lte)")
            check_filter(want)


def _compare(have: Any, want: Any) -> bool:
    if isinstance(want, dict):
        if any(k.startswith("$") for k in want):
            return all(_operator(have, op, arg) for op, arg in want.items())
        return isinstance(have, dict) and all(_compare(have.get(k), v) for k, v in want.items())
    if isinstance(want, list | tuple):
        return (
            isinstance(have, list | tuple)
            and len(have) == len(want)
            and all(_compare(h, w) for h, w in zip(have, want, strict=True))
        )
    return bool(have == want)


def _operator(have: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(have == arg)
    if op == "$ne":
        return bool(have != arg)
    if op not in OPERATORS:
        raise ValueError(f"unsupported filter operator {op!r} (LangGraph's are $eq $ne $gt $gte $lt $lte)")
    try:
        a, b = float(have), float(arg)
    except (TypeError, ValueError):
        return False  # a missing or non-numeric value is not in any range
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]


def index_text(value: Mapping[str, Any], fields: Sequence[str] | None) -> str:
    """The text memq indexes for an item: the values at ``fields`` (LangGraph's
    JSON paths, ``"$"`` the whole value as JSON), or without fields every
    string in the value, keys left out."""
    if fields is None:
        return "\n".join(_strings(value))
    return "\n".join(t for path in fields for t in get_text_at_path(dict(value), path) if t.strip())


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        if value.strip():
            yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def _time(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


class MemqStore(BaseStore):
    """LangGraph's ``BaseStore`` on memq (see the module's note for the mapping).

    :param client: the app's client (the caller keeps ownership of it).
    :param user: every namespace is this memq user's. Default: the label at
        ``user_label``.
    :param user_label: which namespace label names the memq user, when no
        ``user`` is given. Default 0 (``(user_id, "memories")``); 1 for
        ``("memories", user_id)``. A namespace without that label raises
        ``InvalidNamespaceError``.
    :param fields: what of a value is indexed when a put does not say
        (``index=None``): LangGraph JSON paths (``["text"]``,
        ``["facts[*].text"]``, ``["$"]``). Default: every string in the value.
    :param consistency: whose writes a read sees. Default ``"any"``: every
        write any client had acknowledged before it.
    :param facts_label: the last label of a namespace that reads the
        user's facts (see above); None: no such namespace. Default ``"memq_facts"``.
    :param loop: the event loop the client runs on, for the sync methods.
        Default: the loop running when the store is made, or the one of its
        first async call.
    """

    supports_ttl = False

    def __init__(
        self,
        client: MemoryClient,
        *,
        user: str | None = None,
        user_label: int = 0,
        fields: Sequence[str] | None = None,
        consistency: Consistency = "any",
        facts_label: str | None = FACTS_LABEL,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        if user_label < 0:
            raise ValueError("user_label is a label's position: 0 or more")
        self.client = client
        self.user = user
        self.user_label = user_label
        self.fields = list(fields) if fields is not None else None
        self.consistency: Consistency = consistency
        self.facts_label = facts_label
        self._client_loop = ClientLoop(loop, owner="MemqStore", instead="aget, aput, asearch, ainvoke on the graph")
        self._in_flight: asyncio.Semaphore | None = None
        self._thread: threading.Thread | None = None  # connect(): the loop's thread, which close() ends

    @classmethod
    def connect(
        cls,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        *,
        app: str,
        user: str | None = None,
        user_label: int = 0,
        fields: Sequence[str] | None = None,
        consistency: Consistency = "any",
        **connect_options: Any,
    ) -> MemqStore:
        """A store for sync code (a graph run with ``invoke``, a script without
        an event loop): it starts an event loop in a thread of its own,
        connects a client there (``connect_options`` are
        :meth:`MemoryClient.connect`'s) and closes both on :meth:`close` (or
        ``with``). :attr:`loop` is that loop, for a
        :class:`~memq.contracts.adapters.langgraph_context.MemqContext` on
        the same client."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="memq-langgraph-store", daemon=True)
        thread.start()
        try:
            connecting = MemoryClient.connect(servers, app=app, **connect_options)
            client = asyncio.run_coroutine_threadsafe(connecting, loop).result()
        except BaseException:
            _stop(loop, thread)
            raise
        store = cls(client, user=user, user_label=user_label, fields=fields, consistency=consistency, loop=loop)
        store._thread = thread
        return store

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the client runs on (None until known)."""
        return self._client_loop.loop

    def close(self) -> None:
        """Close what :meth:`connect` opened: the client and its loop's
        thread. A store made with a client of its own caller does nothing."""
        thread, self._thread = self._thread, None
        if thread is None or self._client_loop.loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.client.close(), self._client_loop.loop).result()
        finally:
            _stop(self._client_loop.loop, thread)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the mapping ------------------------------------------------------------------

    def ref(self, namespace: tuple[str, ...], key: str) -> ItemRef:
        """Where an item lives; raises for a namespace memq cannot hold."""
        if not namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        if not isinstance(key, str):
            raise TypeError(f"an item key is a string, not {type(key).__name__}")
        return ItemRef(namespace, key, self._user_of(namespace), session_of(namespace, key))

    def _user_of(self, namespace: tuple[str, ...]) -> str:
        if self.user is not None:
            return self.user
        if len(namespace) <= self.user_label:
            raise InvalidNamespaceError(
                f"namespace {namespace} has no label {self.user_label}, which names its memq user "
                f"(MemqStore(user_label={self.user_label})): use a longer namespace, another user_label, "
                "or a store for one user (MemqStore(client, user=...))"
            )
        return namespace[self.user_label]

    def _pinned_user(self, path: Sequence[str], wildcard: bool) -> str | None:
        """The one memq user every namespace starting with ``path`` belongs
        to; None when the path leaves it open (then the whole app is read).
        Only with ``wildcard`` does a ``*`` leave it open: in a search it is
        the user named ``*``, who must not read everyone's items."""
        if self.user is not None:
            return self.user
        if len(path) > self.user_label and not (wildcard and path[self.user_label] == "*"):
            return path[self.user_label]
        return None

    # --- BaseStore ----------------------------------------------------------------------

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops``, returning their results in order. Puts (the last one
        per item wins) are made first, so the batch's reads see them.

        Awaited on another running loop than the client's (a store made for
        sync code, used by an async graph too), the work runs on the client's."""
        self._client_loop.remember()
        ops = list(ops)
        loop = self._client_loop.loop
        if loop is not asyncio.get_running_loop() and loop is not None and loop.is_running():
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._run(ops), loop))
        return await self._run(ops)

    async def _run(self, ops: list[Op]) -> list[Result]:
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for op in ops:
            validate_op_namespace(op)
            if isinstance(op, PutOp):
                self._check_put(op)
                puts[(op.namespace, op.key)] = op
            elif isinstance(op, SearchOp):
                check_filter(op.filter)
            elif not isinstance(op, GetOp | ListNamespacesOp):
                raise ValueError(f"unknown store operation {type(op).__name__}")
        await asyncio.gather(*(self._bounded(self._put(op)) for op in puts.values()))
        return list(await asyncio.gather(*(self._bounded(self._read(op)) for op in ops)))

    async def _bounded(self, work: Coroutine[Any, Any, T]) -> T:
        if self._in_flight is None:  # made on the client's loop, where every op runs
            self._in_flight = asyncio.Semaphore(OPS_IN_FLIGHT)
        async with self._in_flight:
            return await work

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return self._client_loop.wait(self.abatch(list(ops)))

    def _check_put(self, op: PutOp) -> None:
        if op.value is not None and not isinstance(op.value, Mapping):
            raise TypeError(f"a store value is a dict, not {type(op.value).__name__}")
        if op.ttl is not None:
            raise NotImplementedError(
                "MemqStore has no per-item TTL (memq expires sessions per app: expiry.apps on the "
                "server); put with ttl=None"
            )
        if self._facts_of(op.namespace) is not None:
            raise InvalidNamespaceError(
                f"namespace {op.namespace} reads the facts memq derives about its user: they are not written "
                f"(a namespace ending in {self.facts_label!r} is read-only)"
            )
        self.ref(op.namespace, op.key)  # a namespace or key memq cannot hold raises before anything is written

    def _facts_of(self, namespace: Sequence[str]) -> str | None:
        """The user whose facts ``namespace`` reads, or None when it is not a facts namespace."""
        if self.facts_label is None or not namespace or namespace[-1] != self.facts_label:
            return None
        return self.ref(tuple(namespace), "")[2]

    async def _read(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            if (user := self._facts_of(op.namespace)) is not None:
                return await self._fact(op.namespace, user, op.key)
            return await self._get(self.ref(op.namespace, op.key))
        if isinstance(op, SearchOp):
            if (user := self._facts_of(op.namespace_prefix)) is not None:
                return await self._search_facts(op, user)
            return await self._search(op)
        if isinstance(op, ListNamespacesOp):
            return await self._list_namespaces(op)
        return None  # a put: done before the reads

    # --- writes ---------------------------------------------------------------------------

    async def _put(self, op: PutOp) -> None:
        """Replace the item: delete its session (the old value and indexed
        text with it: a delete forgets), then write the new one as the
        session's only event, published on condition that nothing came
        after the delete. A concurrent put of the same item that came
        between makes it start again, so the session never holds two."""
        ref = self.ref(op.namespace, op.key)
        event = None if op.value is None else self._event(op)
        for attempt in range(PUT_TRIES):
            deleted = await self.client.delete_session(ref.user, ref.session, missing_ok=True)
            if event is None:
                return
            try:
                await self.client.append(ref.user, ref.session, event, expect_seq=deleted)
                return
            except Conflict:
                # full jitter: racing puts of one item must not retry in step
                await asyncio.sleep(random.uniform(0, doubling(attempt, *PUT_BACKOFF)))
        raise Conflict(f"{PUT_TRIES} puts of item {ref.key!r} in {ref.namespace} met other writers' puts: try again")

    def _event(self, op: PutOp) -> Event:
        """The event an item is: its value in the state delta, its indexed
        text (if any) as a user message, which memq indexes."""
        assert op.value is not None
        value = dict(op.value)
        now = datetime.now(UTC).timestamp()
        record = {"value": value, "created_at": now, "updated_at": now}
        fields = self.fields if op.index is None else op.index
        text = "" if fields is False else index_text(value, fields)
        message = Message(role="user", parts=[TextPart(text=text)]) if text else None
        return Event(author=AUTHOR, message=message, actions=Actions(state_delta={STATE_KEY: record}), timestamp=now)

    # --- reads ----------------------------------------------------------------------------

    async def _get(self, ref: ItemRef) -> Item | None:
        try:
            state = await self.client.get_state(ref.user, ref.session, consistency=self.consistency)
        except NotFound:
            return None
        record = state.get(STATE_KEY)
        if not isinstance(record, dict):
            return None  # a session of that name that this store did not write
        return Item(
            value=record["value"],
            key=ref.key,
            namespace=ref.namespace,
            created_at=_time(record["created_at"]),
            updated_at=_time(record["updated_at"]),
        )

    async def _get_many(self, refs: Sequence[ItemRef]) -> list[Item | None]:
        limit = asyncio.Semaphore(READS)

        async def one(ref: ItemRef) -> Item | None:
            async with limit:
                return await self._get(ref)

        return list(await asyncio.gather(*(one(r) for r in refs)))

    async def _items(self, path: Sequence[str], wildcard: bool) -> list[ItemRef]:
        """The items in namespaces whose first labels match ``path`` (with
        ``wildcard``, ``*`` any one label; else literally), most recently put
        first: one listing of the pinned user's sessions, or of the whole app's."""
        user = self._pinned_user(path, wildcard)
        condition = MatchCondition("prefix", tuple(path))
        found = []
        async for info in self.client.iter_sessions(user, PAGE, consistency=self.consistency):
            item = item_of(info.session)
            if item is None or not matches(item[0], condition, wildcard):
                continue
            if self.user is None and (len(item[0]) <= self.user_label or item[0][self.user_label] != info.user):
                continue  # not where this store would put it (another user_label's item)
            found.append(ItemRef(item[0], item[1], info.user, info.session))
        return found

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        if op.query:
            return await self._query(op)
        refs = await self._items(op.namespace_prefix, wildcard=False)
        found = await self._matching(refs, op.filter, op.offset + op.limit)
        return [SearchItem(i.namespace, i.key, i.value, i.created_at, i.updated_at) for _, i in found[op.offset :]]

    async def _query(self, op: SearchOp) -> list[SearchItem]:
        """memq's hybrid search over each user's items: best first, only
        what clears memq's relevance floor, the filter applied after."""
        assert op.query
        prefix = tuple(op.namespace_prefix)
        user = self._pinned_user(prefix, wildcard=False)
        users = [user] if user is not None else sorted({r.user for r in await self._items(prefix, wildcard=False)})
        answers = await asyncio.gather(
            *(
                self.client.search(u, op.query, k=SEARCH_K, authors=[AUTHOR], consistency=self.consistency)
                for u in users
            )
        )
        scored: dict[str, tuple[float, ItemRef]] = {}
        for u, answer in zip(users, answers, strict=True):
            for hit in answer.results:
                item = item_of(hit.session_id)
                if item is None or item[0][: len(prefix)] != prefix or hit.session_id in scored:
                    continue
                scored[hit.session_id] = (hit.score, ItemRef(item[0], item[1], u, hit.session_id))
        ranked = sorted(scored.values(), key=lambda s: -s[0])
        found = await self._matching([ref for _, ref in ranked], op.filter, op.offset + op.limit)
        return [
            SearchItem(i.namespace, i.key, i.value, i.created_at, i.updated_at, score=ranked[n][0])
            for n, i in found[op.offset :]
        ]

    async def _search_facts(self, op: SearchOp, user: str) -> list[SearchItem]:
        """The user's facts (:meth:`MemoryClient.facts`), the filter applied after."""
        namespace = tuple(op.namespace_prefix)
        view = await self.client.facts(user, op.query or None, limit=min(SEARCH_K, op.offset + op.limit))
        items = [SearchItem(namespace, f.id, *_fact_fields(f), score=f.score) for f in view.facts]
        kept = [i for i in items if filter_matches(i.value, op.filter)]
        return kept[op.offset : op.offset + op.limit]

    async def _fact(self, namespace: tuple[str, ...], user: str, fact_id: str) -> Item | None:
        """A fact by its id as it is now (its latest revision), or None."""
        try:
            history = await self.client.fact_history(user, fact_id)
        except (NotFound, InvalidRequest):  # another user's, none, or not a fact id
            return None
        fact = history.revisions[-1].fact
        if fact.invalid_from is not None:
            return None  # contradicted: the namespace holds the current facts, as its search does
        value, created_at, updated_at = _fact_fields(fact)
        return Item(value=value, key=fact.id, namespace=namespace, created_at=created_at, updated_at=updated_at)

    async def _matching(
        self, refs: Sequence[ItemRef], filter: dict[str, Any] | None, want: int
    ) -> list[tuple[int, Item]]:
        """The first ``want`` of ``refs`` that still exist and pass ``filter``,
        with their positions in ``refs``: read a chunk at a time, so a page
        of a long listing or of 100 hits reads about a page of values."""
        kept: list[tuple[int, Item]] = []
        chunk = max(want, READS)
        for start in range(0, len(refs), chunk):
            items = await self._get_many(refs[start : start + chunk])
            kept += [(start + n, i) for n, i in enumerate(items) if i is not None and filter_matches(i.value, filter)]
            if len(kept) >= want:
                break
        return kept[:want]

    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        prefixes = [c.path for c in conditions if c.match_type == "prefix"]
        refs = await self._items(prefixes[0] if prefixes else (), wildcard=True)
        namespaces = {r.namespace for r in refs if all(matches(r.namespace, c) for c in conditions)}
        if op.max_depth is not None:
            namespaces = {ns[: op.max_depth] for ns in namespaces}
        return sorted(namespaces)[op.offset : op.offset + op.limit]

    # --- sync ---------------------------------------------------------------------------------


def _fact_fields(fact: FactView) -> tuple[dict[str, Any], datetime, datetime]:
    """A fact as a store item's value, created_at and updated_at (both its first source's time)."""
    value = {
        "statement": fact.statement,
        "entities": list(fact.entities),
        "valid_from": fact.valid_from,
        "sources": [s.model_dump() for s in fact.sources],
    }
    at = _time(fact.valid_from)
    return value, at, at


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()
