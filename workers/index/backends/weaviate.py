"""The Weaviate index backend (production): hybrid BM25 + vector search over
self-provided vectors.

Generations are collections ``<collection>_<n>``; the live one is the
Weaviate *alias* ``<collection>`` (Weaviate >= 1.32), so :meth:`promote` is one
atomic alias switch and every read or write of the live generation goes
through the alias, resolved by the server at that moment. A generation's model,
dimension and scoping are JSON in its collection's ``description``: they are
created and deleted together with the collection, so they can never disagree
with it, and one ``list_all`` call reads them all (a separate meta collection
would need its own writes and cleanup).

Users are kept apart in one of two ways (``WeaviateSettings.scoping``):

- ``filter``: one shard; every query carries ``user_key = scope_key(app, user)``.
- ``tenant``: multi-tenancy, one tenant per user (created on first insert),
  so a query only ever touches that user's shard and deleting a user can drop
  the whole tenant.

Facts that bite (Weaviate 1.38, weaviate-client 4.23): ``delete_many``
deletes at most 10,000 objects per call; the tenants REST API does not resolve
aliases (we resolve them first); a query on a tenant that does not exist yet
is an error, not an empty result; deleting a collection leaves an alias that
pointed to it dangling.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import grpc  # type: ignore[import-untyped]  # grpcio ships no type information (only RpcError is used)
import httpx
import weaviate
from weaviate.classes.config import Configure, DataType, Property, Tokenization, VectorDistances
from weaviate.classes.data import DataObject
from weaviate.classes.init import AdditionalConfig, Auth, GrpcConfig, Timeout
from weaviate.classes.query import Filter, HybridFusion, MetadataQuery, Sort
from weaviate.exceptions import (
    UnexpectedStatusCodeError,
    WeaviateBaseError,
    WeaviateInsertManyAllFailedError,
    WeaviateQueryError,
)

from memq.contracts.backoff import stepped
from memq.contracts.ids import scope_key
from memq.workers.index.backends.base import IndexMeta, IndexUnavailable, UnknownGeneration
from memq.workers.index.stems import stemmed_grams, stemmed_query_grams, stems
from memq.workers.memory.recall import CONTEXT_WEIGHT, Doc, Hit, SearchQuery, split_search_text
from memq.workers.settings import WeaviateSettings

log = logging.getLogger("memq.indexing.weaviate")

DELETE_CAP = 10_000  # the server's per-call limit for delete_many (QUERY_MAXIMUM_RESULTS)
INSERT_CHUNK = 500  # objects per gRPC batch request
CONCURRENCY = 8  # batch or aggregate requests in flight at once
PAGE = 500  # export page size
VECTOR = "default"  # the client's name for the one unnamed vector

# Filterable exact-match strings (FIELD): never BM25-searched.
_KEYS = ("app", "user", "session", "user_key", "session_key", "author", "role", "doc_id")
_RETURN = ["doc_id", "app", "user", "session", "seq", "author", "role", "timestamp", "text", "search_text"]
_EXPLAIN = re.compile(r"Result Set (keyword|vector),\w+\) Document [\w-]+: original score ([-+\d.eE]+)")
# httpx errors other than ConnectError/ReadTimeout (a read cut by the server's
# death: ReadError, RemoteProtocolError) come out of the client unwrapped.
_CONNECTION_ERRORS = (WeaviateBaseError, OSError, asyncio.TimeoutError, httpx.HTTPError, grpc.RpcError)
# The server answered, with an error (a query on a dropped collection among them);
# only then is it worth asking whether the collection is still there.
_ANSWERED = (WeaviateQueryError, UnexpectedStatusCodeError)
# gRPC's default reconnect backoff grows to 120 s: after a Weaviate outage of
# ten seconds or so, searches stayed unavailable for up to a minute after the
# server was back (tests/faults). Retry the connection at least every second.
GRPC_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# A client that fails for this long is replaced by a fresh one (new HTTP pool,
# new gRPC channel); reconnecting waits these delays between attempts.
REOPEN_AFTER_S = 2.0
RECONNECT_DELAYS_S = (0.2, 0.5, 1.0)  # refused at once while the server is down: cheap to retry

Scoping = str  # "tenant" | "filter"


class _BatchRetries:
    """How many batch requests the client has sent again by itself (it
    retries an UNAVAILABLE one, saying so only in its log): such a batch may
    have been half-applied by a server that died under it. Seen only while
    that logger's INFO is on (memq's default); a redelivered batch is
    rewritten whatever the log level."""

    count = 0


def _drop_batch_error_dumps(record: logging.LogRecord) -> bool:
    if isinstance(record.msg, str) and record.msg.startswith("Batch objects received exception"):
        _BatchRetries.count += 1
    # insert_many logs every failed object (texts and vectors) at ERROR; we
    # raise IndexUnavailable with the messages instead.
    return not (isinstance(record.msg, dict) and "errors" in record.msg)


logging.getLogger("weaviate-client").addFilter(_drop_batch_error_dumps)


def tenant_name(user_key: str) -> str:
    """A tenant name for a user (``[A-Za-z0-9_-]{1,64}``); ``user_key`` is a
    sha256 hex digest, so its first 252 bits keep users apart."""
    return "u" + user_key[:63]


def _properties() -> list[Property]:
    keys = [
        Property(name=n, data_type=DataType.TEXT, tokenization=Tokenization.FIELD, index_searchable=False)
        for n in _KEYS
    ]
    return keys + [
        Property(name="seq", data_type=DataType.INT),
        Property(name="timestamp", data_type=DataType.NUMBER),
        Property(name="text", data_type=DataType.TEXT, index_searchable=False, index_filterable=False),
        Property(name="search_text", data_type=DataType.TEXT, tokenization=Tokenization.WORD, index_filterable=False),
        # search_text's Porter stems (stems.py): what BM25 searches in a generation marked "stems"
        Property(name="stems", data_type=DataType.TEXT, tokenization=Tokenization.WORD, index_filterable=False),
        # grams.py's terms of unspaced scripts (Latin words among them stemmed), searched beside
        # "stems" in a generation marked "grams"; split at spaces only, so a Thai bigram stays whole
        Property(name="grams", data_type=DataType.TEXT, tokenization=Tokenization.WHITESPACE, index_filterable=False),
        # In a generation marked "context": "stems" and "grams" hold the turn's own text, and these
        # the previous turn's, which BM25 weighs CONTEXT_WEIGHT (recall.split_search_text)
        Property(name="context_stems", data_type=DataType.TEXT, tokenization=Tokenization.WORD, index_filterable=False),
        Property(
            name="context_grams", data_type=DataType.TEXT, tokenization=Tokenization.WHITESPACE, index_filterable=False
        ),
    ]


def searched_properties(target: _Target) -> list[str]:
    """The properties BM25 searches in ``target``, with their weights."""
    if target.context:
        return ["stems", "grams", f"context_stems^{CONTEXT_WEIGHT}", f"context_grams^{CONTEXT_WEIGHT}"]
    return ["stems", "grams"] if target.grams else ["stems"] if target.stems else ["search_text"]


def _all(filters: Iterable[Any]) -> Any:
    fs = [f for f in filters if f is not None]
    return None if not fs else fs[0] if len(fs) == 1 else Filter.all_of(fs)


def _any_equal(prop: str, values: Sequence[str]) -> Any:
    if not values:
        return None
    fs = [Filter.by_property(prop).equal(v) for v in values]
    return fs[0] if len(fs) == 1 else Filter.any_of(fs)


def _vector(v: Sequence[float]) -> list[float]:
    return v.tolist() if hasattr(v, "tolist") else [float(x) for x in v]


def _doc(obj: Any, vector: bool = False) -> Doc:
    p = obj.properties
    vec = None
    if vector and obj.vector:
        vec = obj.vector.get(VECTOR) if isinstance(obj.vector, dict) else obj.vector
    return Doc(
        id=p["doc_id"],
        app=p["app"],
        user=p["user"],
        session=p["session"],
        seq=int(p["seq"]),
        author=p["author"],
        role=p["role"],
        timestamp=float(p["timestamp"]),
        text=p["text"],
        search_text=p["search_text"],
        vector=vec,
    )


def _index_meta(name: str, d: dict) -> IndexMeta:
    """A generation's meta from its collection's description (no
    ``min_similarity`` in one created before generations recorded their floor)."""
    floor = d.get("min_similarity")
    return IndexMeta(name, d["model"], int(d["dim"]), float(d["created_at"]), None if floor is None else float(floor))


def _target(name: str, description: dict) -> _Target:
    # "filter" and no stems: what a generation that names neither uses
    return _Target(
        name,
        description.get("scoping", "filter"),
        bool(description.get("stems", False)),
        bool(description.get("grams", False)),
        bool(description.get("context", False)),
    )


def _tenant_missing(exc: BaseException) -> bool:
    return "tenant not found" in str(exc)


@dataclass(frozen=True)
class _Target:
    name: str  # a collection, or the alias for the live generation
    scoping: Scoping
    stems: bool = False  # BM25 searches the "stems" property (its description says so; older generations lack it)
    grams: bool = False  # ... and the "grams" property (likewise: unspaced scripts' bigrams)
    context: bool = False  # ... and the previous turn's apart (likewise: the turn's own words rank first)

    @property
    def tenants(self) -> bool:
        return self.scoping == "tenant"


class WeaviateIndex:
    """:class:`~memq.workers.index.backends.base.IndexBackend` on a Weaviate server.

    Parameters (all in ``settings``, a :class:`~memq.workers.settings.WeaviateSettings`):

    - ``url``: HTTP URL, e.g. ``http://localhost:8080`` (``https`` makes gRPC
      use TLS too); required here.
    - ``grpc_port``: the server's gRPC port on the same host (default 50051).
    - ``api_key``: sent as the API key when set (never logged); default none.
    - ``collection``: the alias name; generations are ``<collection>_<n>``
      (default ``MemqMemory``; Weaviate capitalises the first letter).
    - ``scoping``: ``filter`` (default) or ``tenant``, for new generations; an
      existing generation keeps the scoping it was created with.
    - ``timeout_s``: per-request timeout (default 30).

    The connection heals itself: a call with no connected client connects
    first (at most once per ``RECONNECT_DELAYS_S`` step while that fails,
    raising :class:`IndexUnavailable` in between), and a client whose calls
    have failed for ``REOPEN_AFTER_S`` is replaced at the next call. A
    connect that was interrupted (cancelled by a caller's timeout, say)
    leaves no half-open client behind: such a client, never told the
    server's version, failed every later call ("current version is 0.0.0").
    """

    name = "weaviate"

    def __init__(self, settings: WeaviateSettings):
        if not settings.url:
            raise ValueError("WeaviateIndex needs weaviate.url")
        base = settings.collection[:1].upper() + settings.collection[1:]
        if not re.fullmatch(r"[A-Z][A-Za-z0-9_]*", base):
            raise ValueError(f"bad Weaviate collection name {settings.collection!r}: use [A-Za-z][A-Za-z0-9_]*")
        self.settings = settings
        self.url = settings.url  # checked above: set
        self.alias = base
        self._gen_re = re.compile(rf"{re.escape(base)}_(\d+)")
        self._client: weaviate.WeaviateAsyncClient | None = None
        self._metas: dict[str, dict] = {}  # collection -> its description (never changes)
        self._live_meta: dict | None = None  # the live generation's description, cached; reset after any failure
        self._lock = asyncio.Lock()  # one (re)connect at a time
        self._failing_since: float | None = None  # first failure since the last success
        self._attempts = 0  # reconnects since the last success
        self._next_attempt = 0.0  # monotonic time before which no reconnect is tried
        self._retired: dict[asyncio.Task, weaviate.WeaviateAsyncClient] = {}  # replaced, closed a little later

    # --- connection -----------------------------------------------------------

    async def open(self) -> None:
        """Connect. Raises :class:`IndexUnavailable` if the server cannot be reached."""
        async with self._lock:
            if self._client is None:
                self._client = await self._connect()
                self._succeeded()

    async def _connect(self) -> weaviate.WeaviateAsyncClient:
        s = self.settings
        url = urlsplit(self.url)
        secure = url.scheme == "https"
        client = weaviate.use_async_with_custom(
            http_host=url.hostname or "localhost",
            http_port=url.port or (443 if secure else 80),
            http_secure=secure,
            grpc_host=url.hostname or "localhost",
            grpc_port=s.grpc_port,
            grpc_secure=secure,
            auth_credentials=Auth.api_key(s.api_key.get_secret_value()) if s.api_key else None,
            additional_config=AdditionalConfig(
                timeout=Timeout(init=min(s.timeout_s, 10), query=s.timeout_s, insert=s.timeout_s),
                grpc_config=GrpcConfig(channel_options=GRPC_RECONNECT),
            ),
            skip_init_checks=True,  # else connect() asks PyPI for a newer client
        )
        try:
            await client.connect()
        except BaseException as exc:  # cancelled too: never keep a client that does not know the server
            await _close_quietly(client)
            if isinstance(exc, _CONNECTION_ERRORS):
                raise IndexUnavailable(f"Weaviate at {s.url}: {exc}") from None
            raise
        return client

    async def _ready(self) -> None:
        """Connect (again) if there is no client, or if the one there has
        failed for ``REOPEN_AFTER_S``; raises IndexUnavailable meanwhile."""
        if self._client is not None and not self._stale():
            return
        if self._lock.locked():  # another call is connecting: fail fast rather than queue behind it
            raise IndexUnavailable(f"Weaviate at {self.settings.url}: reconnecting")
        async with self._lock:
            if self._client is not None and not self._stale():
                return
            now = time.monotonic()
            if now < self._next_attempt:
                raise IndexUnavailable(f"Weaviate at {self.settings.url}: reconnecting")
            self._next_attempt = now + stepped(RECONNECT_DELAYS_S, self._attempts)
            self._attempts += 1
            old, self._client = self._client, None
            if old is not None:
                log.info("Weaviate calls have failed for %.0fs: reconnecting", now - (self._failing_since or now))
                self._retire(old)
            self._client = await self._connect()
            self._failing_since = None

    def _stale(self) -> bool:
        since = self._failing_since
        return (
            since is not None and time.monotonic() - since >= REOPEN_AFTER_S and time.monotonic() >= self._next_attempt
        )

    def _succeeded(self) -> None:
        self._failing_since, self._attempts, self._next_attempt = None, 0, 0.0

    def _unavailable(self, exc: BaseException) -> IndexUnavailable:
        """A failed call: the error to raise; the client is replaced if this goes on."""
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        return IndexUnavailable(f"Weaviate: {exc}")

    def _retire(self, client: weaviate.WeaviateAsyncClient) -> None:
        # Calls still in flight on it finish (or time out) first.
        async def later() -> None:
            await asyncio.sleep(self.settings.timeout_s)
            await _close_quietly(client)

        task = asyncio.create_task(later(), name="close a replaced Weaviate client")
        self._retired[task] = client
        task.add_done_callback(lambda t: self._retired.pop(t, None))

    async def close(self) -> None:
        retired, self._retired = self._retired, {}
        for task, client in retired.items():
            task.cancel()
            await _close_quietly(client)
        if self._client is not None:
            client, self._client = self._client, None
            await _close_quietly(client)

    @property
    def client(self) -> weaviate.WeaviateAsyncClient:
        if self._client is None:
            raise IndexUnavailable(f"Weaviate at {self.settings.url}: not connected")
        return self._client

    # --- generations ------------------------------------------------------------

    def _meta(self, name: str, description: str | None) -> IndexMeta | None:
        if not self._gen_re.fullmatch(name):
            return None
        try:
            d = json.loads(description or "")
            meta = _index_meta(name, d)
        except (ValueError, KeyError, TypeError):
            return None  # not one of ours
        self._metas[name] = d
        return meta

    async def _describe(self, name: str) -> dict | None:
        if name not in self._metas:
            try:
                config = await self.client.collections.use(name).config.get()
            except WeaviateBaseError as exc:
                if "not found" in str(exc) or "404" in str(exc):
                    return None
                raise
            if self._meta(config.name, config.description) is None:
                return None
        return self._metas[name]

    async def _live_name(self) -> str | None:
        alias = await self.client.alias.get(alias_name=self.alias)
        return alias.collection if alias else None

    async def _live_collection(self) -> str:
        """The collection behind the alias, for the APIs that do not resolve aliases."""
        name = await self._live_name()
        if name is None:  # dropped since this call found a live generation
            raise IndexUnavailable(f"Weaviate alias {self.alias} points at no collection now; retry")
        return name

    async def live(self) -> IndexMeta | None:
        try:
            await self._ready()
            name = await self._live_name()
            d = await self._describe(name) if name else None
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable(exc) from None
        self._succeeded()
        if name is None or d is None:  # no alias, or one that points at no generation of ours
            self._live_meta = None
            return None
        self._live_meta = d
        return _index_meta(name, d)

    async def generations(self) -> list[IndexMeta]:
        try:
            await self._ready()
            found = await self.client.collections.list_all(simple=True)
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable(exc) from None
        self._succeeded()
        metas = [m for name, c in found.items() if (m := self._meta(name, c.description))]
        return sorted(metas, key=lambda m: self._number(m.generation))

    def _number(self, generation: str) -> int:
        """The n of ``<alias>_<n>``, a name _meta has already checked."""
        m = self._gen_re.fullmatch(generation)
        if m is None:
            raise ValueError(f"{generation!r} is not a generation of {self.alias}")
        return int(m.group(1))

    async def create_generation(self, model: str, dim: int, *, min_similarity: float | None = None) -> IndexMeta:
        scoping = self.settings.scoping
        try:
            await self._ready()
            taken = [m.generation for m in await self.generations()]
            if live := await self._live_name():
                taken.append(live)  # even a dangling alias's name stays unused
            top = max((int(m.group(1)) for t in taken if (m := self._gen_re.fullmatch(t))), default=0)
            for n in range(top + 1, top + 10):  # another process may take a number at the same time
                name, created = f"{self.alias}_{n}", time.time()
                description = json.dumps(
                    {
                        "model": model,
                        "dim": dim,
                        "created_at": created,
                        "scoping": scoping,
                        "stems": True,
                        "grams": True,
                        "context": True,
                        "min_similarity": min_similarity,
                    }
                )
                try:
                    await self.client.collections.create(
                        name,
                        description=description,
                        properties=_properties(),
                        vector_config=Configure.Vectors.self_provided(
                            vector_index_config=Configure.VectorIndex.hnsw(distance_metric=VectorDistances.COSINE)
                        ),
                        multi_tenancy_config=Configure.multi_tenancy(
                            enabled=True, auto_tenant_creation=True, auto_tenant_activation=True
                        )
                        if scoping == "tenant"
                        else None,
                    )
                except WeaviateBaseError as exc:
                    if "already exists" in str(exc):
                        continue
                    raise
                self._meta(name, description)
                self._succeeded()
                return IndexMeta(name, model, dim, created, min_similarity)
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable(exc) from None
        raise IndexUnavailable("could not find a free generation number")

    async def promote(self, generation: str) -> None:
        try:
            await self._ready()
            if await self._describe(generation) is None:
                raise ValueError(f"no generation {generation!r}")
            previous = await self._live_name()
            if previous == generation:
                return
            if previous is None:
                try:
                    await self.client.alias.create(alias_name=self.alias, target_collection=generation)
                except WeaviateBaseError as exc:
                    if "already exists" not in str(exc):  # created meanwhile: switch it below
                        raise
                    previous = await self._live_name()
            if previous is not None:
                await self.client.alias.update(alias_name=self.alias, new_target_collection=generation)
            self._live_meta = self._metas[generation]
            if previous is not None and previous != generation:
                await self.client.collections.delete(previous)
                self._metas.pop(previous, None)
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable(exc) from None
        self._succeeded()

    async def drop_generation(self, generation: str) -> None:
        if not self._gen_re.fullmatch(generation):
            raise ValueError(f"{generation!r} is not a generation of {self.alias}")
        try:
            await self._ready()
            if await self._live_name() == generation:
                raise ValueError(f"{generation} is live: promote another generation instead")
            await self.client.collections.delete(generation)
        except _CONNECTION_ERRORS as exc:
            raise self._unavailable(exc) from None
        self._succeeded()
        self._metas.pop(generation, None)

    async def _target(self, generation: str | None) -> _Target | None:
        """Where an operation goes: the named generation, or the live one
        through its alias; None when there is no live generation."""
        if generation is not None:
            d = await self._describe(generation)
            if d is None:
                raise UnknownGeneration(f"no generation {generation!r}")
            return _target(generation, d)
        if self._live_meta is None and await self.live() is None:
            return None
        return _target(self.alias, self._live_meta or {})  # live() has just cached it

    async def _failed(self, exc: BaseException, generation: str | None) -> IndexUnavailable:
        """The error to raise for a failed call on ``generation`` (None: the
        live one). A named generation that is gone was dropped by a switch,
        most likely in another process (``memq index rebuild``) while this
        one still had its description cached: :class:`UnknownGeneration`,
        so the caller re-reads the live one, and no sign of a failing
        connection (which would have this client replaced)."""
        if generation is None:
            self._live_meta = None  # promoted elsewhere, maybe to another scoping: re-read
        elif isinstance(exc, _ANSWERED) and await self._vanished(generation):
            self._metas.pop(generation, None)
            return UnknownGeneration(f"no generation {generation!r}: it was dropped")
        return self._unavailable(exc)

    async def _vanished(self, generation: str) -> bool:
        """Whether the collection of ``generation`` is gone (False when the server cannot say)."""
        try:
            return not await self.client.collections.exists(generation)
        except (*_CONNECTION_ERRORS, IndexUnavailable):
            return False

    # --- writes -----------------------------------------------------------------

    async def upsert(self, docs: Sequence[Doc], *, generation: str | None = None, rewrite: bool = False) -> None:
        """Insert or overwrite ``docs`` (object uuid = ``Doc.uuid``). Raises
        :class:`IndexUnavailable` naming the first errors if any doc failed.

        A server killed mid-batch can keep an object whose keyword (and
        vector) index entries it lost, and putting the same object again does
        not repair it: the server re-indexes only what changed. Measured on
        1.38.8 (SIGKILL during a 3,000-object batch, five runs): 3 to 16
        stored objects not found by BM25, up to 7 still not after an
        identical put, up to 2 after a delete_many by ids and a put, none
        after deleting each by id and putting it. So a
        ``rewrite``, or a chunk the client had to send again, is deleted
        object by object first and then put (a rare path: redeliveries)."""
        if not docs:
            return
        groups: dict[str | None, list[DataObject[dict[str, Any], None]]] = {}  # properties, no references
        try:
            await self._ready()
            target = await self._target(generation)
            if target is None:
                raise IndexUnavailable("no live index generation: create and promote one first")
            for d in docs:
                # A doc without a vector (a keyword-only generation, dim 0) is stored for BM25 alone.
                props = {k: getattr(d, k) for k in ("app", "user", "session", "user_key", "session_key", "author")}
                props |= {"role": d.role, "doc_id": d.id, "seq": d.seq, "timestamp": d.timestamp}
                props |= {"text": d.text, "search_text": d.search_text}
                own, context = split_search_text(d.search_text) if target.context else (d.search_text, "")
                if target.stems:
                    props["stems"] = stems(own)
                if target.grams:
                    props["grams"] = stemmed_grams(own)
                if target.context:
                    props["context_stems"], props["context_grams"] = stems(context), stemmed_grams(context)
                tenant = tenant_name(d.user_key) if target.tenants else None
                vector = _vector(d.vector) if d.vector is not None else None
                groups.setdefault(tenant, []).append(DataObject(properties=props, uuid=d.uuid, vector=vector))
            errors: list[str] = []
            limit = asyncio.Semaphore(CONCURRENCY)

            async def send(tenant: str | None, chunk: list[DataObject[dict[str, Any], None]]) -> None:
                coll = self.client.collections.use(target.name)
                coll = coll.with_tenant(tenant) if tenant else coll

                async def delete_each() -> None:
                    # By id, one request each: a half-written object may have
                    # lost its id filter entry too, so a delete_many by ids
                    # misses it (tests/bench/weaviate_halfwrite.py).
                    for o in chunk:
                        if o.uuid is not None:
                            await coll.data.delete_by_id(o.uuid)

                async with limit:
                    try:
                        retries = _BatchRetries.count
                        if rewrite:
                            await delete_each()
                        res = await coll.data.insert_many(chunk)
                        if _BatchRetries.count != retries and not res.errors:  # maybe a retry (ours or another's)
                            await delete_each()
                            res = await coll.data.insert_many(chunk)
                    except WeaviateInsertManyAllFailedError as exc:
                        errors.append(str(exc))
                        return
                errors.extend(e.message for e in res.errors.values())

            # One request per tenant and chunk: a batch call takes one tenant.
            await asyncio.gather(
                *(
                    send(tenant, objs[i : i + INSERT_CHUNK])
                    for tenant, objs in groups.items()
                    for i in range(0, len(objs), INSERT_CHUNK)
                )
            )
        except _CONNECTION_ERRORS as exc:
            raise await self._failed(exc, generation) from None
        self._succeeded()  # the server answered, even if it refused some docs
        if errors:
            # A retry (with rewrite) sends the same uuids again, so it converges.
            raise IndexUnavailable(f"{len(errors)} of {len(docs)} docs not indexed: {'; '.join(errors[:3])}")

    async def _delete_many(self, name: str, tenant: str | None, where: Any) -> int:
        coll = self.client.collections.use(name)
        coll = coll.with_tenant(tenant) if tenant else coll
        deleted = 0
        while True:
            try:
                res = await coll.data.delete_many(where=where)
            except WeaviateBaseError as exc:
                if tenant and _tenant_missing(exc):
                    return deleted
                raise
            if res.failed:
                raise IndexUnavailable(f"{res.failed} deletes failed")
            deleted += res.successful
            if res.matches < DELETE_CAP:  # the server caps each call
                return deleted

    async def delete_session(
        self,
        app: str,
        user: str,
        session: str,
        *,
        before_seq: int | None = None,
        at_seq: int | None = None,
        generation: str | None = None,
    ) -> None:
        where = _all(
            [
                Filter.by_property("session_key").equal(scope_key(app, user, session)),
                Filter.by_property("seq").less_than(before_seq) if before_seq is not None else None,
                Filter.by_property("seq").equal(at_seq) if at_seq is not None else None,
            ]
        )
        try:
            await self._ready()
            if (target := await self._target(generation)) is None:
                return
            tenant = tenant_name(scope_key(app, user)) if target.tenants else None
            await self._delete_many(target.name, tenant, where)
        except _CONNECTION_ERRORS as exc:
            raise await self._failed(exc, generation) from None
        self._succeeded()

    async def delete_user(
        self, app: str, user: str, *, before_seq: int | None = None, generation: str | None = None
    ) -> None:
        """In tenant scoping without ``before_seq``, drops the user's tenant.
        With ``before_seq`` it deletes by filter inside the tenant: dropping the
        tenant could take a newer doc that another replica is writing."""
        user_key = scope_key(app, user)
        older = Filter.by_property("seq").less_than(before_seq) if before_seq is not None else None
        try:
            await self._ready()
            if (target := await self._target(generation)) is None:
                return
            if not target.tenants:
                await self._delete_many(
                    target.name, None, _all([Filter.by_property("user_key").equal(user_key), older])
                )
            elif older is not None:
                await self._delete_many(target.name, tenant_name(user_key), older)
            else:
                # The tenants REST API does not resolve aliases.
                name = target.name if generation else await self._live_collection()
                await self.client.collections.use(name).tenants.remove([tenant_name(user_key)])
        except _CONNECTION_ERRORS as exc:
            if _tenant_missing(exc):
                return
            raise await self._failed(exc, generation) from None
        self._succeeded()

    # --- reads ------------------------------------------------------------------

    async def search(self, query: SearchQuery, *, generation: str | None = None) -> list[Hit]:
        """``query.k`` best hits, best first. Scores: keyword = BM25, vector =
        1 - cosine distance, hybrid = Weaviate's relative-score fusion with
        ``query.alpha`` (``scores`` also holds each side's original score).
        Hybrid without text runs as vector, without a vector as keyword."""
        text, vector, mode = query.text.strip(), query.vector, query.mode
        if mode == "hybrid" and not text:
            mode = "vector"
        elif mode == "hybrid" and vector is None:
            mode = "keyword"
        if mode == "vector" and vector is None:
            raise ValueError("a vector search needs query.vector")
        if query.k <= 0 or (mode == "keyword" and not text):
            return []
        try:
            await self._ready()
            if (target := await self._target(generation)) is None:
                return []
            user_key = scope_key(query.app, query.user)
            where = _all(
                [
                    None if target.tenants else Filter.by_property("user_key").equal(user_key),
                    Filter.by_property("session_key").equal(scope_key(query.app, query.user, query.session))
                    if query.session is not None
                    else None,
                    _any_equal("author", query.authors),
                    _any_equal("role", query.roles),
                    Filter.by_property("timestamp").greater_or_equal(query.since) if query.since is not None else None,
                    Filter.by_property("timestamp").less_than(query.until) if query.until is not None else None,
                ]
            )
            coll = self.client.collections.use(target.name)
            if target.tenants:
                coll = coll.with_tenant(tenant_name(user_key))
            common = {"filters": where, "limit": query.k, "return_properties": _RETURN}
            searched = searched_properties(target)
            if target.grams:
                text = " ".join(dict.fromkeys(stems(text).split() + stemmed_query_grams(text).split()))
            elif target.stems:
                text = stems(text)
            if (target.stems or target.grams) and not text:  # punctuation only: no word to match
                if mode == "keyword":
                    return []
                mode = "vector" if mode == "hybrid" else mode
            if mode == "keyword":
                res = await coll.query.bm25(
                    text, query_properties=searched, return_metadata=MetadataQuery(score=True), **common
                )
                hits = [Hit(_doc(o), o.metadata.score, {"keyword": o.metadata.score}) for o in res.objects]
            elif vector is None:  # never: a vector search without one failed above, a hybrid one ran as keyword
                raise ValueError(f"a {mode} search needs query.vector")
            elif mode == "vector":
                res = await coll.query.near_vector(
                    _vector(vector), return_metadata=MetadataQuery(distance=True), **common
                )
                sims = [(o, 1.0 - _asked(o.metadata.distance, "distance")) for o in res.objects]
                hits = [Hit(_doc(o), s, {"vector": s}) for o, s in sims]
            else:
                res = await coll.query.hybrid(
                    text,
                    vector=_vector(vector),
                    alpha=query.alpha,  # explicit: the server's default may change
                    fusion_type=HybridFusion.RELATIVE_SCORE,
                    query_properties=searched,
                    return_metadata=MetadataQuery(score=True, explain_score=True),
                    **common,
                )
                hits = [
                    Hit(_doc(o), _asked(o.metadata.score, "score"), _hybrid_scores(o.metadata)) for o in res.objects
                ]
        except _CONNECTION_ERRORS as exc:
            if _tenant_missing(exc):
                return []  # the user has nothing indexed yet
            raise await self._failed(exc, generation) from None
        self._succeeded()
        return hits

    def _scope_filter(self, app: str | None, user: str | None, tenants: bool) -> Any:
        if app is not None and user is not None:
            return None if tenants else Filter.by_property("user_key").equal(scope_key(app, user))
        return _all(
            [
                Filter.by_property("app").equal(app) if app is not None else None,
                Filter.by_property("user").equal(user) if user is not None else None,
            ]
        )

    async def _tenants(self, target: _Target, app: str | None, user: str | None) -> Sequence[str | None]:
        """The tenants an app/user scope can be in (all of them unless both are given)."""
        if not target.tenants:
            return [None]
        if app is not None and user is not None:
            return [tenant_name(scope_key(app, user))]
        name = target.name if target.name != self.alias else await self._live_collection()
        return sorted(await self.client.collections.use(name).tenants.get())

    async def count(self, *, app: str | None = None, user: str | None = None, generation: str | None = None) -> int:
        try:
            await self._ready()
            if (target := await self._target(generation)) is None:
                return 0
            where = self._scope_filter(app, user, target.tenants)
            limit = asyncio.Semaphore(CONCURRENCY)

            async def one(tenant: str | None) -> int:
                coll = self.client.collections.use(target.name)
                async with limit:
                    try:
                        res = await (coll.with_tenant(tenant) if tenant else coll).aggregate.over_all(
                            total_count=True, filters=where
                        )
                    except WeaviateBaseError as exc:
                        if tenant and _tenant_missing(exc):
                            return 0
                        raise
                return res.total_count or 0

            total = sum(await asyncio.gather(*(one(t) for t in await self._tenants(target, app, user))))
        except _CONNECTION_ERRORS as exc:
            raise await self._failed(exc, generation) from None
        self._succeeded()
        return total

    async def export(
        self, *, app: str | None = None, user: str | None = None, generation: str | None = None
    ) -> AsyncIterator[Doc]:
        """Every doc with its vector, optionally of one app or user. Unfiltered
        walks use the server's cursor; filtered ones (the cursor takes no
        filter) page by ``seq``."""
        try:
            await self._ready()
            if (target := await self._target(generation)) is None:
                return
            for tenant in await self._tenants(target, app, user):
                coll = self.client.collections.use(target.name)
                coll = coll.with_tenant(tenant) if tenant else coll
                where = self._scope_filter(app, user, target.tenants)
                pages = (
                    _by_seq(coll, where)
                    if where is not None
                    else coll.iterator(include_vector=True, return_properties=_RETURN, cache_size=PAGE)
                )
                try:
                    async for obj in pages:
                        yield _doc(obj, vector=True)
                except WeaviateBaseError as exc:
                    if not (tenant and _tenant_missing(exc)):
                        raise
        except _CONNECTION_ERRORS as exc:
            raise await self._failed(exc, generation) from None


async def _by_seq(coll: Any, where: Any) -> AsyncIterator[Any]:
    """Filtered objects in ``seq`` order, a page at a time (keyset paging:
    ``seq >= last``, skipping what the previous page already gave)."""
    last, page = None, PAGE
    seen: set[UUID] = set()  # the objects at seq ``last`` already given
    while True:
        f = where if last is None else Filter.all_of([where, Filter.by_property("seq").greater_or_equal(last)])
        res = await coll.query.fetch_objects(
            filters=f, sort=Sort.by_property("seq"), limit=page, include_vector=True, return_properties=_RETURN
        )
        fresh = [o for o in res.objects if o.uuid not in seen]
        for o in fresh:
            yield o
        if len(res.objects) < page:
            return
        top = res.objects[-1].properties["seq"]
        if top != last:
            last, seen = top, set()
        seen |= {o.uuid for o in res.objects if o.properties["seq"] == top}
        if not fresh:
            page *= 2  # more docs share one seq than fit in a page


async def _close_quietly(client: weaviate.WeaviateAsyncClient) -> None:
    try:
        await client.close()
    except Exception as exc:  # closing a broken connection may fail too; nothing to keep
        log.debug("closing a Weaviate client: %s", exc)


def _asked(value: float | None, what: str) -> float:
    """A metadata value the query asked for, which Weaviate then returns for every object."""
    if value is None:
        raise ValueError(f"Weaviate returned an object without the {what} asked for")
    return value


def _hybrid_scores(metadata: Any) -> dict[str, float]:
    scores = {"hybrid": metadata.score}
    # Each side's original score (BM25; cosine similarity) from the explanation.
    for side, value in _EXPLAIN.findall(metadata.explain_score or ""):
        scores[side] = float(value)
    return scores
