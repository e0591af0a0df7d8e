"""Facts about a user, and the bookkeeping that keeps them current: pure logic.

A :class:`Fact` is a statement about one user of one app ("Caroline plans to
adopt a child"), the entities it names, the source events it was extracted
from, and its validity interval: true from its first source's time until a
later statement contradicted it. This module decides what a candidate fact
(extracted by an LLM from new turns) does to the user's facts; it reads and
writes nothing. Storing facts, and the generations they are rebuilt into,
belong to the store that applies these changes (:mod:`memq.workers.sql.facts`,
driven by the fact worker, :mod:`memq.workers.facts.worker`).

The rules:

- **Ids are digests.** A fact's id is a digest of its app, user, normalised
  statement and first source (session and event id): replaying the same
  decisions gives the same ids. An id is given once: dropping sources later
  does not rename the fact.
- **Nothing is overwritten in place.** Every change is a new *revision* of one
  fact (``revision`` counts from 1), returned as a :class:`Change`; a store
  appends revisions, and :func:`replay` returns the log beside the state.
  A merge only appends sources and entities (``valid_from`` follows the
  earliest source); an invalidation only sets ``invalid_from`` and
  ``invalidated_by``. An invalidated fact stays readable with its interval
  ``[valid_from, invalid_from)``.
- **Decisions** (:class:`Decision`): ``add`` the candidate as a new fact;
  ``merge`` it into a current fact (its sources join that fact; the existing
  statement is kept); ``invalidate`` facts it contradicts (the candidate is
  added and each named fact becomes invalid from the candidate's time, never
  before its own ``valid_from``); ``none`` (noise: nothing changes).
- **No LLM for exact duplicates.** :func:`predecide` merges a candidate whose
  normalised statement (:func:`normalise`) equals a current fact's; the LLM is
  asked only about the others, shown the facts :func:`matching` picks.
- **Rejected, never guessed.** A decision naming an unknown fact, another
  user's fact or an already-invalid one raises :class:`DecisionRejected`.
- **Idempotent.** A redelivered step changes nothing: a merge whose target
  already holds the candidate's sources, an add or invalidation whose new
  fact (same id) exists. One turn may yield several facts.
- **Forgetting is erasure, not history** (:func:`without_sources`): a fact
  whose sources are all forgotten is removed; one that keeps other sources
  loses the forgotten ones (and its ``valid_from`` moves to the first one
  left); a fact that a removed fact had invalidated is current again, as a
  replay without the forgotten event would leave it. :func:`scrub` removes
  the forgotten sources from a log of revisions too, so no earlier revision
  keeps what was forgotten.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

Action = Literal["add", "merge", "invalidate", "none"]
ChangeKind = Literal["added", "merged", "invalidated", "sources_dropped", "restored", "removed"]
SourceKey = tuple[str, str]  # (session, event id): event ids are unique within a session

# matching(): a current fact is shown to the LLM when it shares an entity or
# at least this share of its words with the candidate (Jaccard on word sets).
MIN_OVERLAP = 0.3
MATCH_LIMIT = 10


class DecisionRejected(ValueError):
    """A decision that cannot be applied to the user's facts (unknown, foreign or invalid fact)."""


@dataclass(frozen=True, order=True)
class Source:
    """A source event of a fact: where it is (``session``, ``event_id``), its
    stream ``seq`` and its time ``at`` (the event's timestamp, unix seconds)."""

    seq: int
    session: str
    event_id: str
    at: float

    @property
    def key(self) -> SourceKey:
        return (self.session, self.event_id)


@dataclass(frozen=True)
class Fact:
    """One revision of a fact (see the module doc for the rules)."""

    id: str
    app: str
    user: str
    statement: str
    entities: tuple[str, ...]
    sources: tuple[Source, ...]  # ordered by seq, never empty
    valid_from: float  # the first source's time
    invalid_from: float | None = None
    invalidated_by: str | None = None  # the id of the fact that contradicted it
    revision: int = 1

    @property
    def current(self) -> bool:
        return self.invalid_from is None


@dataclass(frozen=True)
class Candidate:
    """A fact as extracted, not yet reconciled: ``sources`` are the turns it came from."""

    app: str
    user: str
    statement: str
    entities: tuple[str, ...]
    sources: tuple[Source, ...]

    def __post_init__(self) -> None:
        if not normalise(self.statement):
            raise ValueError("a candidate fact needs a statement")
        if not self.sources:
            raise ValueError("a candidate fact needs at least one source")
        object.__setattr__(self, "sources", _sorted_sources(self.sources))
        object.__setattr__(self, "entities", _entities(self.entities))


@dataclass(frozen=True)
class Decision:
    """What a candidate does: ``add``, ``merge`` (into ``merge_into``),
    ``invalidate`` (the facts in ``invalidates``) or ``none``."""

    action: Action
    merge_into: str | None = None
    invalidates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.action not in ("add", "merge", "invalidate", "none"):
            raise ValueError(f"unknown action {self.action!r}")
        if (self.action == "merge") != (self.merge_into is not None):
            raise ValueError("merge_into is required for a merge and allowed only for one")
        if (self.action == "invalidate") != bool(self.invalidates):
            raise ValueError("invalidates is required for an invalidation and allowed only for one")
        object.__setattr__(self, "invalidates", tuple(dict.fromkeys(self.invalidates)))


@dataclass(frozen=True)
class Change:
    """One new revision: ``fact`` as it is after the change (for ``removed``,
    the last revision, which the store deletes with all its history)."""

    kind: ChangeKind
    fact: Fact
    cause: tuple[Source, ...] = field(default=())  # the candidate's sources, or the forgotten ones


# --- normalising, ids -----------------------------------------------------------------

_WORD = re.compile(r"\w+")


def normalise(statement: str) -> str:
    """The form two statements are compared in: NFKC, case-folded, words only,
    single spaces ("Caroline  likes Pottery." == "caroline likes pottery")."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", statement).casefold()))


def fact_id(app: str, user: str, statement: str, first: Source) -> str:
    """The digest naming a fact (32 hex digits): same inputs, same id."""
    key = json.dumps([app, user, normalise(statement), first.session, first.event_id], ensure_ascii=False)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def _sorted_sources(sources: Iterable[Source]) -> tuple[Source, ...]:
    seen: dict[SourceKey, Source] = {}
    for s in sorted(sources):
        seen.setdefault(s.key, s)
    return tuple(seen.values())


def _entities(names: Iterable[str]) -> tuple[str, ...]:
    """Trimmed, deduplicated case-insensitively (the first spelling wins), in order."""
    out: dict[str, str] = {}
    for name in names:
        name = " ".join(name.split())
        if name:
            out.setdefault(name.casefold(), name)
    return tuple(out.values())


# --- choosing what to ask ------------------------------------------------------------


def predecide(facts: Mapping[str, Fact], candidate: Candidate) -> Decision | None:
    """The decision that needs no LLM: a merge into the current fact of the same
    user whose normalised statement is the candidate's (the oldest if several);
    None when the LLM must decide."""
    same = normalise(candidate.statement)
    for fact in sorted(_mine(facts, candidate), key=lambda f: (f.valid_from, f.id)):
        if fact.current and normalise(fact.statement) == same:
            return Decision("merge", merge_into=fact.id)
    return None


def matching(facts: Mapping[str, Fact], candidate: Candidate, limit: int = MATCH_LIMIT) -> list[Fact]:
    """The user's current facts worth showing the LLM beside ``candidate``: those
    sharing an entity (case-insensitive) or at least :data:`MIN_OVERLAP` of their
    words, best first (shared entities, then overlap, then the newest)."""
    names = {e.casefold() for e in candidate.entities}
    words = set(normalise(candidate.statement).split())
    scored = []
    for fact in _mine(facts, candidate):
        if not fact.current:
            continue
        shared = len(names & {e.casefold() for e in fact.entities})
        theirs = set(normalise(fact.statement).split())
        overlap = len(words & theirs) / len(words | theirs) if words | theirs else 0.0
        if shared or overlap >= MIN_OVERLAP:
            scored.append(((-shared, -overlap, -fact.valid_from, fact.id), fact))
    return [fact for _, fact in sorted(scored, key=lambda pair: pair[0])][:limit]


def _mine(facts: Mapping[str, Fact], candidate: Candidate) -> Iterable[Fact]:
    return (f for f in facts.values() if f.app == candidate.app and f.user == candidate.user)


# --- reconciliation ------------------------------------------------------------------


def reconcile(facts: Mapping[str, Fact], candidate: Candidate, decision: Decision) -> list[Change]:
    """The changes ``decision`` makes to ``facts`` (id -> latest revision) for
    ``candidate``; [] when nothing changes. Raises :class:`DecisionRejected`."""
    if decision.action == "none":
        return []
    if decision.action == "merge":
        assert decision.merge_into is not None
        had = facts.get(decision.merge_into)
        if (
            had is not None
            and (had.app, had.user) == (candidate.app, candidate.user)
            and {s.key for s in candidate.sources} <= {s.key for s in had.sources}
        ):
            return []  # a redelivery: merged before
        target = _target(facts, candidate, decision.merge_into, "merge into")
        merged = replace(
            target,
            sources=_sorted_sources((*target.sources, *candidate.sources)),
            entities=_entities((*target.entities, *candidate.entities)),
            revision=target.revision + 1,
        )
        merged = replace(merged, valid_from=merged.sources[0].at)
        return [Change("merged", merged, candidate.sources)]
    first = candidate.sources[0]
    new = Fact(
        id=fact_id(candidate.app, candidate.user, candidate.statement, first),
        app=candidate.app,
        user=candidate.user,
        statement=candidate.statement.strip(),
        entities=candidate.entities,
        sources=candidate.sources,
        valid_from=first.at,
    )
    if new.id in facts:  # the same statement from the same first turn: a redelivery
        return []
    changes = [Change("added", new, candidate.sources)]
    for target in [_target(facts, candidate, i, "invalidate") for i in decision.invalidates]:
        ended = replace(
            target,
            invalid_from=max(new.valid_from, target.valid_from),
            invalidated_by=new.id,
            revision=target.revision + 1,
        )
        changes.append(Change("invalidated", ended, candidate.sources))
    return changes


def _target(facts: Mapping[str, Fact], candidate: Candidate, id: str, verb: str) -> Fact:
    fact = facts.get(id)
    if fact is None:
        raise DecisionRejected(f"cannot {verb} fact {id!r}: no such fact")
    if (fact.app, fact.user) != (candidate.app, candidate.user):
        raise DecisionRejected(f"cannot {verb} fact {id!r}: it is about another user")
    if not fact.current:
        raise DecisionRejected(
            f"cannot {verb} fact {id!r}: invalid since {fact.invalid_from} (by {fact.invalidated_by})"
        )
    return fact


def apply(facts: Mapping[str, Fact], changes: Iterable[Change]) -> dict[str, Fact]:
    """A new mapping with ``changes`` applied (``facts`` is left as it was)."""
    out = dict(facts)
    for change in changes:
        if change.kind == "removed":
            out.pop(change.fact.id, None)
        else:
            out[change.fact.id] = change.fact
    return out


def replay(
    steps: Iterable[tuple[Candidate, Decision]], facts: Mapping[str, Fact] | None = None
) -> tuple[dict[str, Fact], list[Change]]:
    """Apply each ``(candidate, decision)`` in order: the facts and the log of changes."""
    state = dict(facts or {})
    log: list[Change] = []
    for candidate, decision in steps:
        changes = reconcile(state, candidate, decision)
        state = apply(state, changes)
        log += changes
    return state, log


def history(log: Iterable[Change], id: str) -> list[Fact]:
    """Every revision of fact ``id`` in ``log``, oldest first."""
    return [c.fact for c in log if c.fact.id == id and c.kind != "removed"]


# --- forgetting ----------------------------------------------------------------------


def without_sources(facts: Mapping[str, Fact], forgotten: Collection[SourceKey]) -> list[Change]:
    """The changes that forget the source events ``forgotten`` ((session, event
    id) pairs): facts left with no source are removed, the others drop them, and
    facts invalidated by a removed fact are restored. A session delete forgets
    all its events (:func:`sources_in_sessions`); a user delete, all facts."""
    gone = set(forgotten)
    changes: list[Change] = []
    removed: set[str] = set()
    for fact in sorted(facts.values(), key=lambda f: f.id):
        lost = tuple(s for s in fact.sources if s.key in gone)
        if not lost:
            continue
        kept = tuple(s for s in fact.sources if s.key not in gone)
        if kept:
            dropped = replace(fact, sources=kept, valid_from=kept[0].at, revision=fact.revision + 1)
            if dropped.invalid_from is not None:
                dropped = replace(dropped, invalid_from=max(dropped.invalid_from, dropped.valid_from))
            changes.append(Change("sources_dropped", dropped, lost))
        else:
            removed.add(fact.id)
            changes.append(Change("removed", fact, lost))
    latest = apply(facts, changes)
    for fact in sorted(latest.values(), key=lambda f: f.id):
        if fact.invalidated_by in removed:
            restored = replace(fact, invalid_from=None, invalidated_by=None, revision=fact.revision + 1)
            changes.append(Change("restored", restored))
    return changes


def sources_in_sessions(facts: Mapping[str, Fact], sessions: Collection[str]) -> set[SourceKey]:
    """Every source key of ``facts`` in one of ``sessions`` (for a session delete or expiry)."""
    return {s.key for f in facts.values() for s in f.sources if s.session in sessions}


def scrub(log: Sequence[Change], forgotten: Collection[SourceKey]) -> list[Change]:
    """``log`` with the ``forgotten`` sources erased from every revision; a
    revision left with no source is dropped (sources only grow between
    forgettings, so every revision of a fact no source outlives goes)."""
    gone = set(forgotten)
    out = []
    for change in log:
        kept = tuple(s for s in change.fact.sources if s.key not in gone)
        if kept:
            cause = tuple(s for s in change.cause if s.key not in gone)
            out.append(replace(change, fact=replace(change.fact, sources=kept), cause=cause))
    return out


# --- the stored form -------------------------------------------------------------------


def fact_dict(fact: Fact) -> dict:
    """``fact`` as JSON-ready data (what a store keeps and a read returns)."""
    return {
        "id": fact.id,
        "app": fact.app,
        "user": fact.user,
        "statement": fact.statement,
        "entities": list(fact.entities),
        "sources": [{"seq": s.seq, "session": s.session, "event_id": s.event_id, "at": s.at} for s in fact.sources],
        "valid_from": fact.valid_from,
        "invalid_from": fact.invalid_from,
        "invalidated_by": fact.invalidated_by,
        "revision": fact.revision,
    }


def fact_from_dict(data: Mapping) -> Fact:
    """The inverse of :func:`fact_dict`."""
    return Fact(
        id=data["id"],
        app=data["app"],
        user=data["user"],
        statement=data["statement"],
        entities=tuple(data["entities"]),
        sources=tuple(Source(s["seq"], s["session"], s["event_id"], s["at"]) for s in data["sources"]),
        valid_from=data["valid_from"],
        invalid_from=data.get("invalid_from"),
        invalidated_by=data.get("invalidated_by"),
        revision=data.get("revision", 1),
    )


def profile(facts: Iterable[Fact]) -> dict[str, list[Fact]]:
    """The current facts grouped by the entities they name (a fact naming none
    under ``""``), entities and facts in a stable order: the oldest first."""
    groups: dict[str, list[Fact]] = {}
    spelling: dict[str, str] = {}  # "denver" and "Denver" are one entity: the first spelling names it
    for fact in sorted((f for f in facts if f.current), key=lambda f: (f.valid_from, f.id)):
        for entity in fact.entities or ("",):
            name = spelling.setdefault(entity.casefold(), entity)
            groups.setdefault(name, []).append(fact)
    return groups
