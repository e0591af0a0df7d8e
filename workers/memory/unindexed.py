"""A search's memories the index has not reached yet: pure, no I/O.

Every app's messages share one stream and one indexing consumer, in stream
order, so one app's backlog holds every other app's writes behind it. A
search whose ``min_seq`` is above the indexing floor therefore need not wait
for the indexer when what lies between the floor and ``min_seq`` in the
caller's own user scope only adds memories: the query worker reads those
messages from the stream (:mod:`memq.workers.query.stream_unindexed`), makes them
the docs the indexer will make (:func:`tail_docs`), and ranks them with the
index's hits (:meth:`memq.workers.query.search.Searcher.hits`). Anything
that removes memories (a forget, a session or user delete) makes the search
wait for the indexer instead, as every search did before.

What is exact and what is estimated:

- the docs are the indexer's (:func:`memq.workers.memory.recall.doc_for`
  with the same previous turns, read from SQL), and a doc of the tail
  replaces the index's doc of the same event (the indexer overwrites it);
- the vector side is exact: the same model embeds the tail's docs;
- the keyword side is Okapi BM25 (k1 1.2, b 0.75, as FTS5 and Weaviate)
  over the same stems, with the corpus statistics estimated from what is
  in hand (:func:`bm25`): the index's keyword candidates and the tail. A
  tail doc can rank a little apart from where the caught-up index puts it,
  never out of the results for the words it holds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memq.contracts.ids import scope_key
from memq.contracts.schemas import EventForgotten, SessionDeleted, UserDeleted
from memq.workers.memory.recall import CONTEXT_WEIGHT, SUMMARY_ROLE, Doc, StorageScope, Turn, doc_for, turn_of
from memq.workers.memory.tail import MustWait

K1, B = 1.2, 0.75  # BM25's usual constants: FTS5's bm25() and Weaviate's defaults

# Messages that take memories away: the index's hits would need them applied first.
_REMOVES = (EventForgotten, SessionDeleted, UserDeleted)


def tail_docs(items: Iterable[tuple[int, Any]], scope: StorageScope, previous: Mapping[str, Turn] | None) -> list[Doc]:
    """The docs the indexer makes of ``items`` (decoded ``(seq, message)``
    in stream order), as :meth:`memq.workers.indexing.indexer.Indexer.apply`
    does for messages that only add: each event's previous turn from
    ``previous`` (the turn before each session's first event, from SQL; None:
    ``indexing.context_turns`` is 0, no context) and then from the tail
    itself. A later doc of the same event replaces the earlier one, as an
    upsert does. Raise :class:`MustWait` at a message that removes memories."""
    last: dict[str, Turn] = dict(previous or {})
    docs: dict[tuple[str, str], Doc] = {}
    for seq, message in items:
        if isinstance(message, _REMOVES):
            raise MustWait(f"seq {seq} is a {message.kind} message")
        session = getattr(message, "session", None)
        if not session:  # a state set without a session makes no doc
            continue
        key = scope_key(message.app, message.user, session)
        if (doc := doc_for(seq, message, scope, last.get(key))) is None:
            continue
        docs[(doc.session, doc.id)] = doc
        if previous is not None and doc.role != SUMMARY_ROLE:
            last[key] = turn_of(doc)
    return list(docs.values())


def bm25(
    query: Sequence[str],
    docs: Sequence[Sequence[str]],
    corpus: Sequence[Sequence[str]],
    total: int,
    context: Sequence[Sequence[str]] | None = None,
) -> list[float]:
    """Okapi BM25 of each of ``docs`` (their terms) for the ``query``'s
    terms. ``corpus`` (the docs' terms among them) gives the document
    frequencies and the mean length; ``total`` is how many docs the index's
    statistics cover (at least ``len(corpus)``). A term's document frequency
    is then counted among the docs in hand, which hold every doc that matches
    it best: an estimate of the index's, exact for a user whose matching docs
    are all in hand. 0 for a doc that holds none of the terms. ``context``
    (one per doc): the terms of its previous turn, each counted
    :data:`~memq.workers.memory.recall.CONTEXT_WEIGHT` of one of its own (as
    the backends weigh their context columns; the length counts them all)."""
    terms = set(query)
    if not terms or not docs:
        return [0.0] * len(docs)
    n = max(total, len(corpus), 1)
    df: Counter[str] = Counter()
    for held in corpus:
        df.update(terms.intersection(held))
    avgdl = sum(len(held) for held in corpus) / len(corpus) if corpus else 1.0
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms}
    scores = []
    for i, held in enumerate(docs):
        around = context[i] if context is not None else ()
        tf: dict[str, float] = dict(Counter(t for t in held if t in terms))
        for t in around:  # BM25F's weighted frequency, as FTS5's bm25() with column weights
            if t in terms:
                tf[t] = tf.get(t, 0.0) + CONTEXT_WEIGHT
        norm = K1 * (1 - B + B * (len(held) + len(around)) / (avgdl or 1.0))
        scores.append(sum(idf[t] * f * (K1 + 1) / (f + norm) for t, f in tf.items()))
    return scores


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0
