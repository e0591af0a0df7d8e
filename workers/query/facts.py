"""The fact reads: facts about a user, their profile and one fact's history,
from the live fact generation in SQL (:mod:`memq.workers.sql.facts`).

A query ranks the user's current facts as a hybrid search ranks memories:
Okapi BM25 over the index's Porter stems (:func:`memq.workers.memory.unindexed.bm25`)
and the cosine of the search embedder's vectors, fused by relative scores
(:func:`memq.workers.memory.recall.relative_score_fusion`). A user's facts are
few, so they are ranked in hand rather than kept in a second index: their
vectors are made by the query worker's embedder when first asked about and
kept in its vector cache (:meth:`memq.workers.query.search.Searcher.similarities`),
so a change of embedder needs no migration. The relevance floor is the
search's: a fact is returned only if it shares a stem with the query or its
cosine reaches the embedder's floor. Every read is scoped to the request's
app and user: a fact id of anyone else's is not found, exactly as one that
never existed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from memq.contracts import queries as q
from memq.contracts.errors import NotFound, Unavailable
from memq.workers.index.stems import stems
from memq.workers.memory.facts import Fact, profile
from memq.workers.memory.recall import relative_score_fusion
from memq.workers.memory.unindexed import bm25
from memq.workers.sql import facts as store


def fact_view(fact: Fact, score: float | None = None) -> q.FactView:
    return q.FactView(
        id=fact.id,
        statement=fact.statement,
        entities=list(fact.entities),
        sources=[q.FactSource(seq=s.seq, session=s.session, event_id=s.event_id, at=s.at) for s in fact.sources],
        valid_from=fact.valid_from,
        invalid_from=fact.invalid_from,
        invalidated_by=fact.invalidated_by,
        revision=fact.revision,
        score=score,
    )


def _text(fact: Fact) -> str:
    """What a query is matched against, by keyword and by vector: the statement and its entities."""
    return " ".join((fact.statement, *fact.entities))


def ranked(
    facts: list[Fact],
    query: str,
    limit: int,
    *,
    mode: str = "keyword",
    cosines: Sequence[float] | None = None,
    floor: float = 1.0,
    alpha: float = 0.5,
) -> list[tuple[Fact, float]]:
    """``facts`` that relate to ``query``, best first (ties: the newest first).

    ``keyword`` keeps the facts that share a stem (BM25 > 0); with
    ``cosines`` (one per fact), ``vector`` keeps those whose cosine reaches
    ``floor`` and ``hybrid`` those that do either, scored by relative score
    fusion with ``alpha`` on the vector side."""
    terms = stems(query).split()
    docs = [stems(_text(f)).split() for f in facts]
    keyword = bm25(terms, docs, docs, len(docs))
    if cosines is None or mode == "keyword":
        scored = [(f, s) for f, s in zip(facts, keyword, strict=True) if s > 0]
    elif mode == "vector":
        scored = [(f, c) for f, c in zip(facts, cosines, strict=True) if c >= floor]
    else:
        kept = [i for i, (s, c) in enumerate(zip(keyword, cosines, strict=True)) if s > 0 or c >= floor]
        fused = dict(
            relative_score_fusion(
                [(facts[i].id, keyword[i]) for i in kept if keyword[i] > 0],
                [(facts[i].id, cosines[i]) for i in kept],
                alpha,
            )
        )
        scored = [(facts[i], fused[facts[i].id]) for i in kept]
    scored.sort(key=lambda hit: (-hit[1], -hit[0].valid_from, hit[0].id))
    return scored[:limit]


async def ranked_for(
    facts: list[Fact], query: str, limit: int, mode: str, ctx: object
) -> tuple[list[tuple[Fact, float]], str, str | None]:
    """:func:`ranked` with the vector side from the query worker's searcher
    when ``mode`` asks for it. Returns the hits, the mode that answered, and
    why it differs from the one asked for."""
    searcher = getattr(ctx, "searcher", None)
    if mode == "keyword" or not facts:
        return ranked(facts, query, limit), mode, None
    if searcher is None:
        return ranked(facts, query, limit), "keyword", "keyword only: this query worker has no index"
    note = None
    try:
        got = await searcher.similarities(query, [_text(f) for f in facts])
    except Unavailable as exc:
        got, note = None, f"keyword only: the embedder is unavailable ({exc})"
    if got is None:
        return ranked(facts, query, limit), "keyword", note or "keyword only: the index has no vectors"
    cosines, floor, _model = got
    alpha = searcher.settings.recall.alpha
    return ranked(facts, query, limit, mode=mode, cosines=cosines, floor=floor, alpha=alpha), mode, None


async def known(
    conn: AsyncConnection, req: q.Request, text: str | None, limit: int, ctx: object
) -> list[tuple[str, str]]:
    """``(id, statement)`` of up to ``limit`` current facts about the user
    for a context: those that relate to ``text`` (hybrid), best first, then
    the newest of the others. A context never waits for facts: what is
    derived when it is read is what it shows, ranked by keyword alone when
    their vectors would take longer than a recall may."""
    gen = await store.live_generation(conn)
    if gen is None:
        return []
    facts = [f for f in (await store.user_facts(conn, gen.name, req.app, req.user)).values() if f.current]
    hits = await _within_recall_time(facts, text, limit, ctx) if text and text.strip() else []
    shown = {f.id for f, _ in hits}
    rest = sorted((f for f in facts if f.id not in shown), key=lambda f: (-f.valid_from, f.id))
    return [(f.id, f.statement) for f in [*(f for f, _ in hits), *rest][:limit]]


async def _within_recall_time(facts: list[Fact], text: str, limit: int, ctx: object) -> list[tuple[Fact, float]]:
    """Hybrid hits for a context, or keyword ones when the vectors take longer
    than a recall may (``recall.timeout_s``): a user's facts not embedded yet
    are embedded on, shielded, into the searcher's cache for the next
    context, which is never held up by them."""
    searcher = getattr(ctx, "searcher", None)
    if searcher is None:
        return ranked(facts, text, limit)
    ranking = asyncio.ensure_future(ranked_for(facts, text, limit, "hybrid", ctx))
    ranking.add_done_callback(_retrieved)
    try:
        return (await asyncio.wait_for(asyncio.shield(ranking), searcher.settings.recall.timeout_s))[0]
    except TimeoutError:
        return ranked(facts, text, limit)


def _retrieved(task: asyncio.Future) -> None:
    # A shielded ranking nobody waits for any more: its error is the next read's to meet, not the log's.
    if not task.cancelled():
        task.exception()


async def behind(conn: AsyncConnection, req: q.Request) -> tuple[str | None, int]:
    """The live generation's name and how many of the user's sessions it has not derived (up to min_seq)."""
    gen = await store.live_generation(conn)
    if gen is None:
        return None, 0
    return gen.name, await store.behind(conn, gen.name, req.app, req.user, req.min_seq)


async def facts_get(conn: AsyncConnection, req: q.FactsGet, ctx: object) -> q.FactsView:
    name, late = await behind(conn, req)
    if name is None:
        return q.FactsView(facts=[], generation=None, behind=late)
    known = (await store.user_facts(conn, name, req.app, req.user)).values()
    facts = [f for f in known if req.include_invalid or f.current]
    if req.query is None:
        facts.sort(key=lambda f: (f.valid_from, f.id))
        return q.FactsView(facts=[fact_view(f) for f in facts[: req.limit]], generation=name, behind=late)
    hits, mode, note = await ranked_for(facts, req.query, req.limit, req.mode, ctx)
    views = [fact_view(f, s) for f, s in hits]
    return q.FactsView(facts=views, generation=name, behind=late, mode=mode, note=note)


async def facts_profile(conn: AsyncConnection, req: q.ProfileGet, ctx: object) -> q.ProfileView:
    name, late = await behind(conn, req)
    if name is None:
        return q.ProfileView(entities=[], generation=None, behind=late)
    grouped = profile((await store.user_facts(conn, name, req.app, req.user)).values())
    entities = [q.EntityFacts(entity=e, facts=[fact_view(f) for f in fs]) for e, fs in grouped.items()]
    return q.ProfileView(entities=entities, generation=name, behind=late)


async def fact_history(conn: AsyncConnection, req: q.FactHistoryGet, ctx: object) -> q.FactHistoryView:
    gen = await store.live_generation(conn)
    revisions = [] if gen is None else await store.revisions(conn, gen.name, req.fact_id)
    # Another user's or app's fact reads as missing: ids are digests, but a caller may have seen one.
    if not revisions or any((r.fact.app, r.fact.user) != (req.app, req.user) for r in revisions):
        raise NotFound(f"no fact {req.fact_id!r} about user {req.user!r} in app {req.app!r}")
    return q.FactHistoryView(
        revisions=[q.FactRevision(kind=r.kind, fact=fact_view(r.fact), written_at=r.written_at) for r in revisions],
        generation=gen.name if gen else None,
    )
