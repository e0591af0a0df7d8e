"""The fact reads: facts about a user, their profile and one fact's history,
from the live fact generation in SQL (:mod:`memq.workers.sql.facts`).

A query ranks the user's current facts by Okapi BM25 over the index's Porter
stems (:func:`memq.workers.memory.unindexed.bm25`, the estimate the search
already uses for memories the index has not reached): a user's facts are
few, so they are ranked in hand rather than kept in a second index. Facts
that share no stem with the query are not returned (the floor). Every read
is scoped to the request's app and user: a fact id of anyone else's is not
found, exactly as one that never existed.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from memq.contracts import queries as q
from memq.contracts.errors import NotFound
from memq.workers.index.stems import stems
from memq.workers.memory.facts import Fact, profile
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


def ranked(facts: list[Fact], query: str, limit: int) -> list[tuple[Fact, float]]:
    """``facts`` that share a stem with ``query``, best first (ties: the newest first)."""
    terms = stems(query).split()
    docs = [stems(" ".join((f.statement, *f.entities))).split() for f in facts]
    scores = bm25(terms, docs, docs, len(docs))
    hits = [(f, s) for f, s in zip(facts, scores, strict=True) if s > 0]
    hits.sort(key=lambda hit: (-hit[1], -hit[0].valid_from, hit[0].id))
    return hits[:limit]


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
    if req.query is not None:
        views = [fact_view(f, s) for f, s in ranked(facts, req.query, req.limit)]
    else:
        facts.sort(key=lambda f: (f.valid_from, f.id))
        views = [fact_view(f) for f in facts[: req.limit]]
    return q.FactsView(facts=views, generation=name, behind=late)


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
