"""What long-term memory holds and how its searches are fused (pure).

The indexing worker turns stream messages into :class:`Doc`\\ s with
:func:`doc_for`, under a storage scope (Hector's ``storage_scope``):

- ``all``: every event with text (tool calls and results too) and every
  checkpoint summary;
- ``conversational``: user and assistant text only;
- ``summaries_only``: checkpoint summaries only.

A doc's ``search_text`` is what is embedded and matched by BM25: the turn
prefixed with its date and author, because "when did…" and "what did X say…"
questions name exactly those, then the session's previous turn (an answer
often only makes sense with its question: "Yes, last May!"). On the LoCoMo
dev set that took hybrid recall@10 from 0.626 to 0.672 and keyword from
0.546 to 0.648; the next turn as well made it worse (0.636). ``text`` is
the turn itself, what a search returns and recall shows.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from memq.contracts.ids import scope_key
from memq.workers.memory import tokens as tk
from memq.workers.memory.dates import Period, within

StorageScope = Literal["all", "conversational", "summaries_only"]
STORAGE_SCOPES: tuple[str, ...] = ("all", "conversational", "summaries_only")
SearchMode = Literal["keyword", "vector", "hybrid"]
SUMMARY_ROLE = "summary"  # the role of a checkpoint's doc

# Doc uuids are uuid5 in this namespace of the session key and the message id:
# re-indexing the same event always writes the same object, and two users who
# happen to reuse an event id never collide.
DOC_NAMESPACE = uuid.UUID("6c1f2a9e-4b7d-5c3e-9a8f-1d2e3f4a5b6c")


@dataclass(frozen=True)
class Doc:
    """One indexed memory: an event's text or a checkpoint summary."""

    id: str  # the event's (or checkpoint's) id
    app: str
    user: str
    session: str
    seq: int
    author: str
    role: str  # user | assistant | system | tool | summary
    timestamp: float
    text: str
    search_text: str
    vector: Sequence[float] | None = None  # set by the indexing worker

    @property
    def uuid(self) -> str:
        return doc_uuid(self.app, self.user, self.session, self.id)

    @property
    def user_key(self) -> str:
        return scope_key(self.app, self.user)

    @property
    def session_key(self) -> str:
        return scope_key(self.app, self.user, self.session)

    def with_vector(self, vector: Sequence[float]) -> Doc:
        return replace(self, vector=vector)


@dataclass(frozen=True)
class SearchQuery:
    """A scoped search. ``app`` and ``user`` are always required: no search
    crosses users. ``vector`` is the embedded ``text`` (vector and hybrid)."""

    app: str
    user: str
    text: str
    mode: SearchMode = "hybrid"
    k: int = 10
    session: str | None = None
    authors: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    since: float | None = None  # timestamp >= since
    until: float | None = None  # timestamp < until
    alpha: float = 0.5  # hybrid: weight of the vector side
    vector: Sequence[float] | None = None

    def matches(self, doc: Doc) -> bool:
        """Does ``doc`` fall inside this query's scope and filters?"""
        return (
            doc.app == self.app
            and doc.user == self.user
            and (self.session is None or doc.session == self.session)
            and (not self.authors or doc.author in self.authors)
            and (not self.roles or doc.role in self.roles)
            and (self.since is None or doc.timestamp >= self.since)
            and (self.until is None or doc.timestamp < self.until)
        )


@dataclass(frozen=True)
class Hit:
    doc: Doc
    score: float
    scores: Mapping[str, float] = field(default_factory=dict)  # per side, for explanations


def doc_uuid(app: str, user: str, session: str, message_id: str) -> str:
    return str(uuid.uuid5(DOC_NAMESPACE, f"{scope_key(app, user, session)}/{message_id}"))


PREVIOUS_CHARS = 500  # of the previous turn, in search_text: context, not a second document


@dataclass(frozen=True)
class Turn:
    """The previous turn of a session, as it goes into the next doc's search_text."""

    author: str
    text: str


def search_text(author: str, text: str, timestamp: float | None, previous: Turn | None = None) -> str:
    date = tk.event_time({"timestamp": timestamp}) if timestamp is not None else None
    own = f"[{date}] {author}: {text}" if date else f"{author}: {text}"
    if previous is None:
        return own
    return f"{own}\n(after {previous.author}: {previous.text[:PREVIOUS_CHARS]})"


# BM25 weight of the previous turn's words against the turn's own (1.0): the
# context helps a turn be found, but a turn that says the words ranks above
# one that only follows a turn that does (with equal weights "Nice." came
# second for "Python"). Both backends index the two parts apart (split_search_text).
CONTEXT_WEIGHT = 0.5


def split_search_text(text: str) -> tuple[str, str]:
    """A doc's searchable text as the turn's own part and the previous turn's
    (``""`` when there is none), split where :func:`search_text` joined them:
    ``own + context == text``, so a backend may store the two apart."""
    at = text.rfind("\n(after ")
    if at < 0 or previous_turn(text) is None:
        return text, ""
    return text[:at], text[at:]


def previous_turn(text: str) -> Turn | None:
    """The previous turn :func:`search_text` put into a doc's searchable text
    (its first PREVIOUS_CHARS characters), or None: the first turn of a
    session, or a doc indexed without context."""
    at = text.rfind("\n(after ")
    if at < 0 or not text.endswith(")"):
        return None
    author, sep, said = text[at + len("\n(after ") : -1].partition(": ")
    return Turn(author, said) if sep else None


def doc_for(seq: int, message: Any, scope: StorageScope, previous: Turn | None = None) -> Doc | None:
    """The doc a stream message contributes under ``scope``, or None.

    ``message`` is a decoded stream message (:data:`memq.contracts.schemas.StreamMessage`);
    ``previous`` is the session's previous turn that has a doc under the same
    scope (None: the first, or no context wanted). Checkpoints take none.
    """
    kind = getattr(message, "kind", None)
    if kind == "checkpoint":
        if not message.summary.strip():
            return None
        return _doc(message, seq, message.id, message.author, SUMMARY_ROLE, message.timestamp, message.summary)
    if kind != "event" or scope == "summaries_only":
        return None
    event = message.event
    if event.message is None:
        return None
    role = event.message.role
    if scope == "conversational":
        if role not in ("user", "assistant"):
            return None
        text = event.message.text  # text parts only: no tool calls, data or files
    else:
        text = tk.event_text(event.model_dump(mode="json"))
    if not text.strip():
        return None
    return _doc(message, seq, event.id, event.author, role, event.timestamp, text, previous)


def turn_of(doc: Doc) -> Turn:
    return Turn(doc.author, doc.text)


def _doc(
    message: Any, seq: int, id_: str, author: str, role: str, timestamp: float, text: str, previous: Turn | None = None
) -> Doc:
    return Doc(
        id=id_,
        app=message.app,
        user=message.user,
        session=message.session,
        seq=seq,
        author=author,
        role=role,
        timestamp=timestamp,
        text=text,
        search_text=search_text(author, text, timestamp, previous),
    )


# --- fusion ---------------------------------------------------------------------


def _normalised(scored: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Min-max to [0, 1]; a lone score (or all equal) becomes 1."""
    items = [(key, s) for key, s in scored if not math.isnan(s)]
    if not items:
        return {}
    lo = min(s for _, s in items)
    hi = max(s for _, s in items)
    span = hi - lo
    return {key: (s - lo) / span if span > 0 else 1.0 for key, s in items}


def relative_score_fusion(
    keyword: Sequence[tuple[str, float]], vector: Sequence[tuple[str, float]], alpha: float
) -> list[tuple[str, float]]:
    """Weaviate's ``relativeScoreFusion``: each side's scores min-max
    normalised, then ``alpha * vector + (1 - alpha) * keyword``; a key found by
    one side only gets 0 from the other. Best first; ties by key, so the order
    is deterministic."""
    kw, vec = _normalised(keyword), _normalised(vector)
    fused = {key: alpha * vec.get(key, 0.0) + (1 - alpha) * kw.get(key, 0.0) for key in kw.keys() | vec.keys()}
    return sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))


# --- what relates, in which order ------------------------------------------------


def relates(hit: Hit, min_similarity: float) -> bool:
    """Does ``hit`` relate to its query: a keyword match (its words met the
    query's), or a vector similarity of at least ``min_similarity``? A hybrid
    hit needs either; a hit of one side is judged by that side. Without the
    floor, a vector or hybrid search returns its ``k`` nearest memories even
    when they share nothing with the query."""
    keyword, vector = hit.scores.get("keyword"), hit.scores.get("vector")
    return (keyword is not None and keyword > 0) or (vector is not None and vector >= min_similarity)


def order_key(score: float, doc: Doc) -> tuple:
    """Best first; equal scores in the order the memories were made (oldest
    first: time, then session and position in it), the same on every
    backend, so a longer search's results start with a shorter one's."""
    return (-score, doc.timestamp, doc.session, doc.seq, doc.id)


def in_order(hits: Iterable[Hit]) -> list[Hit]:
    return sorted(hits, key=lambda h: order_key(h.score, h.doc))


def recalled_event(doc: Doc) -> dict[str, Any]:
    """A recalled doc in the event shape the context renders."""
    return {
        "id": doc.id,
        "author": doc.author,
        "timestamp": doc.timestamp,
        "message": {"role": doc.role, "parts": [{"type": "text", "text": doc.text}]},
    }


def hit_dict(hit: Hit) -> dict[str, Any]:
    """A hit as Hector's SearchResult fields (plus memq's scope and seq)."""
    d = hit.doc
    return {
        "session_id": d.session,
        "event_id": d.id,
        "content": d.text,
        "author": d.author,
        "timestamp": d.timestamp,
        "score": hit.score,
        "metadata": {"app": d.app, "user": d.user, "seq": d.seq, "role": d.role, **dict(hit.scores)},
    }


# --- ranking: who and when --------------------------------------------------------
#
# A question about a person ("What did Caroline research?") mixes who (the
# author) with what (the content). The name matches every turn its author
# wrote, so it crowds the content out of both BM25 and the embedding. The
# Searcher therefore also searches the named authors' memories for the
# question without the names, and merges both rankings. A "when" question is
# answered by a turn that says when ("I went … yesterday"), so such turns get
# a boost. The weights were chosen by leave-one-conversation-out
# cross-validation on the LoCoMo dev set (docs/benchmarks/index.md).

_NAME_WORD = re.compile(r"\w+")
_WHEN = re.compile(
    r"^\W*(when|how long|how many (days|weeks|months|years)|what (year|month|date|day|time)|which (year|month|day))\b",
    re.IGNORECASE,
)
# English time expressions: relative (yesterday, last week, two years ago),
# named days and months, and years. A heuristic, and English only.
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_DAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_TIME = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|recently|soon|ago|since|weekend"
    rf"|{_DAYS}|(in|on|last|next|this) ({_MONTHS})"
    r"|(last|next|this) (week|weekend|month|year|night|morning|summer|winter|spring|fall|time|\w+day)"
    r"|(a|one|two|three|four|five|six|seven|eight|nine|ten|few|couple of|\d+) (days?|weeks?|months?|years?)"
    r"|(19|20)\d\d)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Ranking:
    """How :func:`rank` merges and boosts a search's candidates."""

    author_boost: float = 0.3  # added for a doc by an author the query names
    time_boost: float = 0.3  # added for a time-stating doc when the query asks "when"
    speaker_weight: float = 1.2  # scales the named-author search's scores
    others_kept: int = 0  # the general search's best hits by other authors, kept in the top k
    date_boost: float = 0.3  # added for a doc dated in a period the query names ("on 9 May, 2023")
    question_penalty: float = 0.3  # times the share of a doc's words in questions, subtracted
    neighbour_weight: float = 0.0  # times the best score of a doc's neighbours in the pool, added


def named_authors(text: str, authors: Iterable[str]) -> tuple[str, ...]:
    """The ``authors`` whose name appears in ``text`` as whole words, in any
    case, possessive included ("Caroline's"). Sorted, so the result is stable."""
    words = " " + " ".join(_NAME_WORD.findall(text.lower())) + " "
    found = set()
    for author in authors:
        name = " ".join(_NAME_WORD.findall(author.lower()))
        if len(name) >= 2 and (f" {name} " in words or f" {name} s " in words):
            found.add(author)
    return tuple(sorted(found))


def without_names(text: str, names: Iterable[str]) -> str:
    """``text`` with each name (and its possessive ``'s``) removed."""
    for name in names:
        text = re.sub(rf"(?<!\w){re.escape(name)}(['’]s)?(?!\w)", " ", text, flags=re.IGNORECASE)
    return " ".join(text.split())


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s*")


def question_share(text: str) -> float:
    """The share of ``text``'s words that are in questions (sentences ending
    with a question mark, full-width included). A turn that only asks ("What's
    your favourite game?") states nothing that answers a query, yet it shares
    the query's words and, being a question too, its embedding's form."""
    asked = total = 0
    for sentence in _SENTENCE_END.split(text):
        words = len(sentence.split())
        total += words
        if sentence.rstrip().endswith(("?", "？")):
            asked += words
    return asked / total if total else 0.0


def asks_when(text: str) -> bool:
    return _WHEN.search(text) is not None


def states_time(text: str) -> bool:
    return _TIME.search(text) is not None


def rank(
    general: Sequence[Hit],
    by_author: Sequence[Hit] = (),
    *,
    named: Sequence[str] = (),
    when: bool = False,
    periods: Sequence[Period] = (),
    k: int,
    ranking: Ranking = Ranking(),
    normalise: bool = False,
) -> list[Hit]:
    """The best ``k`` of both searches' hits, best first.

    A doc's score is its search score (min-max normalised per search when
    ``normalise``: raw BM25 and cosine are not on the 0–1 scale of a hybrid
    score), plus ``author_boost`` if a ``named`` author wrote it, plus
    ``time_boost`` if ``when`` and its text states a time, plus
    ``date_boost`` if it was written in one of the ``periods`` the query
    names (:func:`memq.workers.memory.dates.named_periods`), minus
    ``question_penalty`` times its :func:`question_share`; ``by_author``
    scores are then scaled by ``speaker_weight``. A doc found by both keeps
    its better score. Ties by :func:`order_key`, so the order is deterministic.
    """
    # Keyed by (session, id), unique within the one user a search covers:
    # Doc.uuid is a uuid5 computed on each access, a third of the ranking's time.
    best: dict[tuple[str, str], tuple[float, Hit]] = {}
    for hits, weight in ((general, 1.0), (by_author, ranking.speaker_weight)):
        keys = [(h.doc.session, h.doc.id) for h in hits]
        scores = [h.score for h in hits]
        if normalise:
            normal = _normalised((str(i), s) for i, s in enumerate(scores))
            scores = [normal.get(str(i), 0.0) for i in range(len(hits))]  # NaN: 0
        for key, h, score in zip(keys, hits, scores, strict=True):
            if h.doc.author in named:
                score += ranking.author_boost
            if when and states_time(h.doc.text):
                score += ranking.time_boost
            if periods and within(h.doc.timestamp, tuple(periods)):
                score += ranking.date_boost
            if ranking.question_penalty:
                score -= ranking.question_penalty * question_share(h.doc.text)
            score *= weight
            if key not in best or score > best[key][0]:
                best[key] = (score, h)
    if ranking.neighbour_weight:
        gained = neighbour_scores({key: (score, h.doc) for key, (score, h) in best.items()})
        best = {key: (score + ranking.neighbour_weight * gained.get(key, 0.0), h) for key, (score, h) in best.items()}
    ordered = sorted(best.items(), key=lambda kv: order_key(kv[1][0], kv[1][1].doc))
    top = ordered[:k]
    if named and ranking.others_kept:
        # A trap question attributes one speaker's words to another ("What did
        # Caroline say about X?" when Melanie said it): the boosts bury the
        # turn that shows who said it. Keep the best few by other authors.
        others = [kv for kv in ordered if kv[1][1].doc.author not in named][: min(ranking.others_kept, k)]
        missing = [kv for kv in others if kv not in top]
        if missing:
            kept = top[: k - len(missing)]
            top = sorted(kept + missing, key=lambda kv: order_key(kv[1][0], kv[1][1].doc))
    ordered = top
    return [replace(hit, score=score, scores={**hit.scores, "ranked": score}) for _, (score, hit) in ordered]


def neighbour_scores(pool: Mapping[Any, tuple[float, Doc]]) -> dict[Any, float]:
    """For each doc of ``pool`` (key -> (score, doc)), the best positive score
    of its neighbours in the pool: the turn just before it in its session and
    the turn just after it. Evidence often sits next to the turn that shares
    the question's words ("What did you paint?" / "A sunset, last May").
    Neighbours are found by the previous turn each doc's searchable text
    carries (:func:`previous_turn`), so the pool alone says who is next to whom."""
    by_turn = {(d.session, d.author, d.text[:PREVIOUS_CHARS]): key for key, (_, d) in pool.items()}
    best: dict[Any, float] = {}
    for key, (score, doc) in pool.items():
        previous = previous_turn(doc.search_text)
        if previous is None or doc.role == SUMMARY_ROLE:
            continue
        before = by_turn.get((doc.session, previous.author, previous.text))
        if before is None or before == key:
            continue
        # each gains from the other: the turn before from the one after, and back
        best[before] = max(best.get(before, 0.0), score)
        best[key] = max(best.get(key, 0.0), pool[before][0])
    return best
