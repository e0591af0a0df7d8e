"""Long-term memory for the query worker: the ``search`` op and recall.

The index backend and the embedder (to embed query texts) open on first use,
so a query worker that never searches pays nothing; in a worker process they
are the process's (:meth:`Searcher.share`): `memq up` loads one model, not
one for indexing and another for search. A query is embedded by
the same model as the index's live generation: when the live generation
holds another offline model's vectors than the worker's embedder (a rebuild
from MiniLM to e5 has just switched, or is under way), the searcher opens
that model itself and searches with it; when it cannot (an OpenAI model),
vector and hybrid searches are answered by keyword, and the reply says so:
vectors of two models are never compared. The relevance floor is the live
generation's (calibrated for its model) unless ``recall.min_similarity`` sets one.
A keyword-only index (``indexing.embedder = "none"``, dimension 0) answers
every search and recall by keyword, and a vector or hybrid search says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import fields, replace

from memq.contracts import queries as q
from memq.contracts.errors import Unavailable
from memq.workers import metrics
from memq.workers.index.backends import open_backend
from memq.workers.index.backends.base import IndexBackend, IndexMeta, IndexUnavailable, UnknownGeneration
from memq.workers.index.backends.embedded import STOPWORDS
from memq.workers.index.embedders import open_embedder, open_local
from memq.workers.index.embedders.base import Embedder, EmbedderError, embed_queries
from memq.workers.index.embedders.floors import floor_for
from memq.workers.index.grams import query_terms
from memq.workers.index.stems import stemmed_grams, stemmed_query_grams, stems
from memq.workers.memory.dates import named_periods
from memq.workers.memory.recall import (
    Doc,
    Hit,
    Ranking,
    SearchQuery,
    asks_when,
    hit_dict,
    in_order,
    named_authors,
    order_key,
    rank,
    relates,
    relative_score_fusion,
    split_search_text,
    without_names,
)
from memq.workers.memory.unindexed import bm25, cosine
from memq.workers.settings import RecallSettings, Settings

log = logging.getLogger("memq.query")

LIVE_REFRESH_S = 2.0  # how long the live generation's meta is trusted
SKIPPED_LOG_EVERY_S = 60.0  # at most one "recall skipped" (or "search failed") line this often
# Switches of the live generation one search follows (see Searcher.hits); a
# rebuild takes seconds at least, so a second switch within a search is rare.
SWITCHES_FOLLOWED = 3
# Set in the task of a read whose recall was skipped (the index failed or was
# slow, a switch of generation once among the causes): the query worker does
# not cache that answer, so the next read recalls again instead of being
# served the context without memories until the session's next commit.
recall_skipped: ContextVar[bool] = ContextVar("recall_skipped", default=False)


def ranking_of(recall: RecallSettings) -> Ranking:
    """The ranking the recall settings ask for: each field of :class:`Ranking`
    from the setting of its name, so the settings hold the only defaults."""
    return Ranking(**{f.name: getattr(recall, f.name) for f in fields(Ranking)})


class Searcher:
    def __init__(self, settings: Settings, *, backend: IndexBackend | None = None, embedder: Embedder | None = None):
        self.settings = settings
        self.ranking = ranking_of(settings.recall)  # settings do not change while it runs
        self.backend = backend
        self.embedder = embedder
        self._opened = backend is not None and embedder is not None
        self._shared: tuple[Callable[[], IndexBackend], Callable[[], Awaitable[Embedder]]] | None = None
        self._lent: list[object] = []  # what share() lent: its owner closes it
        self._opening: asyncio.Task | None = None
        self._live: IndexMeta | None = None
        self._live_at = 0.0
        # Query vectors by (model, text), LRU: an agent asks for its context
        # again after each tool call, with the same last user message, and
        # embedding it is most of a recall's CPU (ms on 2 cores).
        self._vectors: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        # The offline embedder of a live generation of another model than
        # ``embedder``'s (model, its opening): one at a time, opened on first need.
        self._other: tuple[str, asyncio.Task] | None = None
        self._skips = _Throttled("recall skipped")
        self._failures = _Throttled("search failed")

    def share(self, index: Callable[[], IndexBackend], embedder: Callable[[], Awaitable[Embedder]]) -> None:
        """Search on these (the process's, closed by it) instead of opening
        an index and an embedder of its own; each is asked for on first use."""
        self._shared = (index, embedder)

    async def _open(self) -> None:
        if self._opened:
            return
        # One opening shared by every caller, and shielded: a recall that
        # times out must not cut it short (a Weaviate connect cancelled
        # halfway left a client that failed every later search), nor start
        # loading the model again and again.
        if self._opening is None:
            self._opening = asyncio.create_task(self._open_now(), name="open the index")
            self._opening.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, even if no one waits
        opening = self._opening
        try:
            await asyncio.shield(opening)
        except (IndexUnavailable, EmbedderError, OSError) as exc:
            raise Unavailable("search: the index is unavailable, retry later") from exc  # the cause: for the log
        finally:
            if opening.done() and not self._opened and self._opening is opening:
                self._opening = None  # it failed: the next call tries again

    async def _open_now(self) -> None:
        if self.backend is None:
            backend = self._shared[0]() if self._shared else open_backend(self.settings)
            await backend.open()  # idempotent: a shared one may be open already
            self.backend = backend  # only once open
            if self._shared:
                self._lent.append(backend)
        if self.embedder is None:
            self.embedder = await (self._shared[1]() if self._shared else open_embedder(self.settings.indexing))
            if self._shared:
                self._lent.append(self.embedder)
        self._opened = True

    def _index(self) -> tuple[IndexBackend, Embedder]:
        """The backend and the embedder, which _open() has set."""
        if self.backend is None or self.embedder is None:
            raise RuntimeError("the Searcher's index is used before _open()")
        return self.backend, self.embedder

    async def close(self) -> None:
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)
        if self.backend is not None and not any(self.backend is lent for lent in self._lent):
            await self.backend.close()
        if self.embedder is not None and not any(self.embedder is lent for lent in self._lent):
            await self.embedder.close()
        await self._drop_other()

    async def _drop_other(self) -> None:
        other, self._other = self._other, None
        if other is None:
            return
        task = other[1]
        if not task.done():
            task.cancel()
        opened = (await asyncio.gather(task, return_exceptions=True))[0]
        if opened is not None and not isinstance(opened, BaseException):  # None: not an offline model
            await opened.close()

    async def _embedder_for(self, live: IndexMeta, embedder: Embedder) -> Embedder:
        """The embedder of ``live``'s vectors: ``embedder`` if it is, else the
        offline model the generation names, opened here (``embedder`` itself
        when there is none such, or it fails to open: logged). A worker
        without an embedder (``none``) loads no model: it answers by keyword."""
        if (live.model, live.dim) == (embedder.model, embedder.dim) or not live.dim or not embedder.dim:
            return embedder
        if self._other is None or self._other[0] != live.model:
            await self._drop_other()
            task = asyncio.create_task(open_local(live.model, self.settings.indexing), name=f"open {live.model}")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, even if no one waits
            self._other = (live.model, task)
            log.info(
                "search: the live index holds %s vectors; opening that model beside %s", live.model, embedder.model
            )
        try:
            other = await asyncio.shield(self._other[1])
        except Exception as exc:  # noqa: BLE001 - any failure: answer by keyword, as without it
            self._failures.note(f"cannot open {live.model} for the live generation's vectors: {exc!r}")
            return embedder
        return other if other is not None and other.dim == live.dim else embedder

    async def live(self, *, fresh: bool = False) -> IndexMeta | None:
        """The live generation, as read at most LIVE_REFRESH_S ago (``fresh``: now)."""
        if fresh or self._live is None or time.monotonic() - self._live_at > LIVE_REFRESH_S:
            backend, _ = self._index()
            self._live = await backend.live()
            self._live_at = time.monotonic()
        return self._live

    async def built(self) -> bool:
        """Whether a live index generation is there to wait for. False when
        there is none, or the index cannot be reached: then the search
        itself fails at once, saying why."""
        try:
            await self._open()
            return await self.live() is not None
        except Exception:
            return False

    async def hits(self, query: SearchQuery, tail: Sequence[Doc] = ()) -> tuple[list[Hit], str, str | None, str | None]:
        """``(hits, mode used, index model, note)``. Raises Unavailable.
        ``tail``: docs the index does not hold yet, ranked with its own
        (:mod:`memq.workers.memory.unindexed`).

        A search pins one generation (both of :meth:`_ranked`'s pools come
        from it, and the mode was chosen for its model). A switch drops the
        old generation as soon as the new one is live, and a search that
        resolved the old one just before answers from the new one instead
        (:class:`UnknownGeneration`: re-read the live generation, search
        again). Retrying on the reader's side rather than delaying the drop:
        the drop runs in another process (``memq index rebuild``), which
        cannot see the searches in flight in the query workers, and no grace
        period outlasts every stalled search; on both backends a vanished
        generation is certain to be reported as such, whatever the timing.
        """
        await self._open()
        backend, embedder = self._index()
        try:
            live = await self.live()
            for _ in range(SWITCHES_FOLLOWED):
                if live is None:
                    raise Unavailable("search: no index has been built yet (is `memq worker indexing` running?)")
                try:
                    return await self._hits_in(backend, embedder, query, live, tail)
                except UnknownGeneration as exc:
                    log.info("search: %s; answering from the generation live now", exc)
                    pinned, live = live, await self.live(fresh=True)
                    if live is not None and live.generation == pinned.generation:
                        raise  # not a switch: the live generation itself is missing
            raise IndexUnavailable(f"the live generation changed {SWITCHES_FOLLOWED} times during one search")
        except (IndexUnavailable, EmbedderError, OSError) as exc:
            self._live = None  # re-read the live generation next time
            # The detail (file paths, server addresses) is for the log, not the
            # client: it stays as the cause, which search() and recall() log.
            raise Unavailable("search: the index is unavailable, retry later") from exc

    async def _hits_in(
        self, backend: IndexBackend, embedder: Embedder, query: SearchQuery, live: IndexMeta, tail: Sequence[Doc] = ()
    ) -> tuple[list[Hit], str, str | None, str | None]:
        """:meth:`hits` in generation ``live``."""
        mode, note = query.mode, None
        if mode != "keyword":
            embedder = await self._embedder_for(live, embedder)
        if mode != "keyword" and 0 in (live.dim, embedder.dim):
            mode = "keyword"
            note = (
                "the index is keyword-only (indexing.embedder = none): answered by keyword"
                if live.dim == 0
                else f"this worker has no embedder (indexing.embedder = none) for the index's "
                f"{live.model} vectors: answered by keyword"
            )
        elif mode != "keyword" and (live.model, live.dim) != (embedder.model, embedder.dim):
            mode = "keyword"
            note = (
                f"the index holds {live.model} vectors and this worker embeds with {embedder.model}: "
                "answered by keyword until both use the same model"
            )
        found = await self._ranked(backend, embedder, replace(query, mode=mode), live, tail)
        return found, mode, live.model, note

    def relevance_floor(self, live: IndexMeta) -> float:
        """The relevance floor of a search in ``live``: ``recall.min_similarity``
        if set, else the generation's own (its model's, for one that records none)."""
        if self.settings.recall.min_similarity is not None:
            return self.settings.recall.min_similarity
        return live.min_similarity if live.min_similarity is not None else floor_for(live.model)

    async def _ranked(
        self, backend: IndexBackend, embedder: Embedder, query: SearchQuery, live: IndexMeta, tail: Sequence[Doc] = ()
    ) -> list[Hit]:
        """The query's best ``k`` after :func:`rank`: a pool of candidates;
        when the text names authors of those candidates (and the query does
        not filter authors itself), a second pool from those authors'
        memories for the text without the names; then boosts."""
        r = self.settings.recall
        generation, min_similarity = live.generation, self.relevance_floor(live)

        async def search(q: SearchQuery, k: int, floor: bool = True) -> list[Hit]:
            vector = None if q.mode == "keyword" else await self._vector(embedder, q.text)
            q = replace(q, vector=vector, k=k)
            if tail:
                found = await self._with_tail(backend, embedder, q, generation, tail)
            else:
                found = await backend.search(q, generation=generation)
            return [h for h in found if relates(h, min_similarity)] if floor else found

        # A pool deeper than k: the backend's choice among hits of equal score
        # at its cut is its own; in_order/rank choose among them alike everywhere.
        pool = max(query.k, r.pool)
        if not r.speaker_aware:
            return in_order(await search(query, pool))[: query.k]
        general = await search(query, pool)
        named = () if query.authors else named_authors(query.text, {h.doc.author for h in general})
        content = without_names(query.text, named) if named else ""
        # Not floored: every memory of a named author relates to the query by
        # its name (a memory's searchable text starts with its author), and
        # the text without the name is a weaker query than the one asked.
        by_author = await search(replace(query, text=content, authors=named), pool, floor=False) if content else []
        return rank(
            general,
            by_author,
            named=named,
            when=asks_when(query.text),
            periods=named_periods(query.text),
            k=query.k,
            ranking=self.ranking,
            normalise=query.mode != "hybrid",
        )

    async def _with_tail(
        self, backend: IndexBackend, embedder: Embedder, q: SearchQuery, generation: str, tail: Sequence[Doc]
    ) -> list[Hit]:
        """The index's best ``q.k`` with ``tail`` among them: each side
        searched in the index, the tail scored on it alike, then fused as a
        backend fuses (:func:`relative_score_fusion`, the top ``max(4k, 50)``
        of each side). A tail doc replaces the index's doc of the same event."""
        docs = [d for d in tail if q.matches(d)]
        if not docs:
            return await backend.search(q, generation=generation)
        mode = q.mode
        if mode == "hybrid" and q.vector is None:
            mode = "keyword"
        pool = (max(q.k * 4, 50) if mode == "hybrid" else q.k) + len(docs)  # room for the replaced ones
        fresh = {(d.session, d.id) for d in docs}
        sides: dict[str, list[tuple[Doc, float]]] = {}
        if mode in ("keyword", "hybrid"):
            held = await backend.search(replace(q, mode="keyword", k=pool), generation=generation)
            kept = [h.doc for h in held if (h.doc.session, h.doc.id) not in fresh]
            parts = [split_search_text(d.search_text) for d in docs]  # the turn's own words, then its context's
            terms, around = [_terms(own) for own, _ in parts], [_terms(context) for _, context in parts]
            total = len(docs) + await backend.count(app=q.app, user=q.user, generation=generation)
            corpus = [t + c for t, c in zip(terms, around, strict=True)] + [_terms(d.search_text) for d in kept]
            scores = bm25(_query_terms(q.text), terms, corpus, total, context=around)
            found = [(h.doc, h.score) for h in held if (h.doc.session, h.doc.id) not in fresh]
            sides["keyword"] = found + [(d, s) for d, s in zip(docs, scores, strict=True) if s > 0]
        if mode in ("vector", "hybrid") and q.vector is not None:
            held = await backend.search(replace(q, mode="vector", k=pool), generation=generation)
            vectors = await self._doc_vectors(embedder, [d.search_text for d in docs])
            found = [(h.doc, h.score) for h in held if (h.doc.session, h.doc.id) not in fresh]
            sides["vector"] = found + [(d, cosine(q.vector, v)) for d, v in zip(docs, vectors, strict=True)]
        if mode != "hybrid":
            side = "keyword" if mode == "keyword" else "vector"
            best = sorted(sides.get(side, []), key=lambda ds: order_key(ds[1], ds[0]))[: q.k]
            return [Hit(d, s, {side: s}) for d, s in best]
        by_key: dict[str, Doc] = {}
        scored: dict[str, dict[str, float]] = {}
        for side, found in sides.items():
            top = sorted(found, key=lambda ds: order_key(ds[1], ds[0]))[:pool]
            for d, s in top:
                by_key[d.uuid] = d
                scored.setdefault(d.uuid, {})[side] = s
        keyword = [(u, s["keyword"]) for u, s in scored.items() if "keyword" in s]
        vector = [(u, s["vector"]) for u, s in scored.items() if "vector" in s]
        fused = relative_score_fusion(keyword, vector, q.alpha)
        hits = [Hit(by_key[u], score, {"hybrid": score, **scored[u]}) for u, score in fused]
        return in_order(hits)[: q.k]

    async def _doc_vectors(self, embedder: Embedder, texts: list[str]) -> list[list[float]]:
        """Vectors of tail docs' texts, by the query vectors' cache: the
        same caller searches again with the same few unindexed memories."""
        keep = self.settings.recall.vector_cache
        # A memory's vector apart from a query's of the same text: e5 embeds them with different prefixes.
        model = f"{embedder.model} passage"
        missing = list(dict.fromkeys(t for t in texts if (model, t) not in self._vectors))
        if missing:
            for text, vector in zip(missing, await embedder.embed(missing), strict=True):
                self._vectors[(model, text)] = vector
        out = []
        for text in texts:
            key = (model, text)
            vector = self._vectors[key]
            self._vectors.move_to_end(key)
            out.append(vector)
        while len(self._vectors) > max(keep, len(texts)):
            self._vectors.popitem(last=False)
        return out

    async def _vector(self, embedder: Embedder, text: str) -> list[float]:
        keep = self.settings.recall.vector_cache
        key = (embedder.model, text)
        if (vector := self._vectors.get(key)) is not None:
            self._vectors.move_to_end(key)
            return vector
        vector = (await embed_queries(embedder, [text]))[0]
        if keep:
            self._vectors[key] = vector
            while len(self._vectors) > keep:
                self._vectors.popitem(last=False)
        return vector

    async def search(self, req: q.Search, tail: Sequence[Doc] = ()) -> q.SearchResults:
        """Answer ``req`` from the index, with ``tail`` (docs of the caller's
        scope it does not hold yet) ranked among its hits."""
        query = SearchQuery(
            app=req.app,
            user=req.user,
            text=req.query,
            mode=req.mode,
            k=req.k,
            session=req.session,
            authors=tuple(req.authors),
            roles=tuple(req.roles),
            since=req.since,
            until=req.until,
            alpha=self.settings.recall.alpha if req.alpha is None else req.alpha,
        )
        try:
            found, mode, model, note = await self.hits(query, tail)
        except Unavailable as exc:
            self._failures.note(_detail(exc))
            raise
        return q.SearchResults(
            results=[q.SearchResult(**hit_dict(h)) for h in found], mode=mode, model=model, note=note
        )

    async def similarities(self, text: str, passages: Sequence[str]) -> tuple[list[float], float, str] | None:
        """The cosine of ``text`` (as a query) with each of ``passages`` (as
        memories), the relevance floor of their model, and the model; None
        when the embedder is ``none``. For rankings over few texts that live
        outside the index (a user's facts): passages are embedded here and
        kept in the query vectors' cache, so each is embedded once per model
        while it is asked about. Raises Unavailable when the embedder cannot open."""
        await self._open()
        embedder = self._index()[1]
        if not embedder.dim:
            return None
        query = await self._vector(embedder, text)
        vectors = await self._doc_vectors(embedder, list(passages)) if passages else []
        floor = self.settings.recall.min_similarity
        return (
            [cosine(query, v) for v in vectors],
            floor_for(embedder.model) if floor is None else floor,
            embedder.model,
        )

    async def recall(self, app: str, user: str, text: str, k: int) -> list[Hit]:
        """Best-effort recall for a context: [] when disabled, empty, slow or
        failing (logged); a context is never held up by the index."""
        r = self.settings.recall
        if not r.auto_recall or k <= 0 or not text.strip():
            return []
        query = SearchQuery(app=app, user=user, text=text, mode=r.mode, k=k, alpha=r.alpha)
        try:
            found, _, _, _ = await asyncio.wait_for(self.hits(query), r.timeout_s)
            return found
        except TimeoutError:
            self._skip("timeout", f"no answer within {r.timeout_s}s")
        except Unavailable as exc:
            self._skip("unavailable", _detail(exc))
        return []

    def _skip(self, reason: str, detail: str) -> None:
        """Count a skipped recall, and say so in the log (throttled)."""
        metrics.RECALL_SKIPPED.labels(reason).inc()
        recall_skipped.set(True)
        self._skips.note(detail)


class _Throttled:
    """A warning at most every SKIPPED_LOG_EVERY_S, with how many there were
    since the last line: an index that is down fails every search and every
    context's recall, and a line each flooded the log (rendering them was
    half of a context miss's CPU: py-spy, tests/bench/query.py without an index)."""

    def __init__(self, what: str):
        self.what = what
        self.count = 0  # since the last line
        self.logged_at: float | None = None

    def note(self, detail: str) -> None:
        self.count += 1
        now = time.monotonic()
        if self.logged_at is not None and now - self.logged_at < SKIPPED_LOG_EVERY_S:
            return
        if self.logged_at is None:
            log.warning("%s: %s", self.what, detail)
        else:
            log.warning("%s: %s (%d in the last %.0fs)", self.what, detail, self.count, now - self.logged_at)
        self.count, self.logged_at = 0, now


def _detail(exc: Unavailable) -> str:
    """What the client was told and, for the log only, why (the cause)."""
    return f"{exc} ({exc.__cause__})" if exc.__cause__ is not None else str(exc)


def _terms(text: str) -> list[str]:
    """A doc's BM25 terms as the backends index them: its Porter stems, and
    the bigrams of unspaced scripts (:mod:`memq.workers.index.stems`)."""
    return stems(text).split() + stemmed_grams(text).split()


def _query_terms(text: str) -> list[str]:
    """A query's BM25 terms: its words but the stopwords, and the bigrams of
    unspaced ones, stemmed alike."""
    kept = (t for t in query_terms(text) if t not in STOPWORDS)
    return list(dict.fromkeys(s for t in kept for s in stemmed_query_grams(t).split()))
