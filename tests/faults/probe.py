"""Queries during a fault, and what makes an answer wrong.

The prober asks history, context and (when an index is in play) search of the
load's sessions, each with ``min_seq`` = a sequence the ledger knows was
acked, and sorts every outcome into: ``correct``; ``late`` (no answer within
the client's timeout); ``error:<code>`` (a typed :class:`MemqError`); or
``untyped:<type>`` (anything else escaping the client, which the issue does
not allow). An answer is *wrong* (see the ``judge_*`` functions, pure) if it
holds an event never published, a duplicate, events out of order, another
session's or user's events, or misses an acked event at or below its
``min_seq``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError, Unavailable

from .load import Ledger, Sent, SessionRef

ALL = {"kind": "all"}  # every event: completeness below min_seq is checkable


# --- judging (pure) ---------------------------------------------------------------


def judge_events(
    seen: Sequence[tuple[int, str]],
    *,
    ledger: Ledger,
    ref: SessionRef,
    expected: Iterable[Sent] = (),
) -> list[str]:
    """Problems with a session's events as answered (``(seq, event id)`` in
    answer order); ``expected``: acked events the answer must hold."""
    problems = []
    ids = [eid for _, eid in seen]
    dups = sorted(eid for eid, n in Counter(ids).items() if n > 1)
    if dups:
        problems.append(f"duplicate events {dups[:3]}")
    seqs = [seq for seq, _ in seen]
    if any(b <= a for a, b in pairwise(seqs)):
        problems.append(f"events out of order: seqs {seqs[:20]}")
    for seq, eid in seen:
        problems += _foreign(ledger, ref, seq, eid, same_session=True)
    have = set(ids)
    missing = [s for s in expected if s.event_id not in have]
    if missing:
        m = missing[0]
        problems.append(f"misses {len(missing)} acked event(s) at or below min_seq, e.g. {m.event_id} (seq {m.seq})")
    return problems


def _foreign(ledger: Ledger, ref: SessionRef, seq: int, eid: str, *, same_session: bool) -> list[str]:
    sent = ledger.sent.get(eid)
    if sent is None:
        return [f"event {eid} (seq {seq}) was never published"]
    if sent.user != ref[0] or (same_session and sent.session != ref[1]):
        return [f"event {eid} of {sent.user}/{sent.session} in an answer about {ref[0]}/{ref[1]}"]
    if sent.seq is not None and sent.seq != seq:
        return [f"event {eid} shown at seq {seq} but acked at seq {sent.seq}"]
    return []


def judge_history(
    view: Any, *, ledger: Ledger, ref: SessionRef, expected: Iterable[Sent], complete: bool = True
) -> list[str]:
    seen = [(e.seq, e.event["id"]) for e in view.events]
    problems = judge_events(seen, ledger=ledger, ref=ref, expected=expected if complete else ())
    if view.checkpoint_seq is not None and seen and seen[0][0] <= view.checkpoint_seq:
        problems.append(f"event at seq {seen[0][0]} is already in the checkpoint up to {view.checkpoint_seq}")
    return problems


def judge_context(view: Any, *, ledger: Ledger, ref: SessionRef, expected: Iterable[Sent]) -> list[str]:
    ctx = view.context or {}
    window = [(w["seq"], w["event"]["id"]) for w in ctx.get("window", [])]
    problems = judge_events(window, ledger=ledger, ref=ref, expected=expected)
    recalled = [(r["seq"], r["event"]["id"], r["event"]["message"]["role"]) for r in ctx.get("recalled", [])]
    dups = [eid for eid, n in Counter(eid for _, eid, _ in recalled).items() if n > 1]
    if dups:
        problems.append(f"recalled twice: {dups[:3]}")
    for seq, eid, role in recalled:
        if role != "summary":  # a checkpoint's summary has no ledger entry
            problems += [f"recalled: {p}" for p in _foreign(ledger, ref, seq, eid, same_session=False)]
    return problems


def judge_search(view: Any, *, ledger: Ledger, app: str, ref: SessionRef, target: Sent | None) -> list[str]:
    """A keyword search for ``target``'s unique token within its session must
    find it (``target`` None: a hybrid search, judged for soundness only)."""
    problems = []
    ids = [r.event_id for r in view.results]
    dups = [eid for eid, n in Counter(ids).items() if n > 1]
    if dups:
        problems.append(f"search returned duplicates {dups[:3]}")
    for r in view.results:
        meta = r.metadata
        if meta.get("app") != app or meta.get("user") != ref[0] or r.session_id != ref[1]:
            problems.append(f"search for {ref} returned {meta.get('app')}/{meta.get('user')}/{r.session_id}")
        elif meta.get("role") != "summary":
            problems += [f"search: {p}" for p in _foreign(ledger, ref, meta.get("seq"), r.event_id, same_session=True)]
    if target is not None and target.event_id not in ids:
        problems.append(f"search for {target.token} missed indexed event {target.event_id} (seq {target.seq})")
    return problems


def classify_error(exc: BaseException, *, elapsed: float = 0.0, patience: float = float("inf")) -> str:
    """``patience``: how long the client waits for an answer; an Unavailable
    after that long is the client giving up (contracts/client.py), i.e. late."""
    if isinstance(exc, Unavailable) and elapsed >= patience - 0.05:
        return "late"
    if isinstance(exc, MemqError):
        code = exc.code if type(exc) is not MemqError else "internal"  # an unknown code from the service
        return f"error:{code}"
    return f"untyped:{type(exc).__name__}"


# --- probing ----------------------------------------------------------------------


class Prober:
    """``concurrency`` loops asking random sessions, ``pause_s`` apart."""

    def __init__(
        self,
        client: MemoryClient,
        ledger: Ledger,
        refs: Sequence[SessionRef],
        *,
        search: bool = False,
        recall: bool = False,
        summary_history: bool = False,
        concurrency: int = 4,
        pause_s: float = 0.05,
    ):
        self.client, self.ledger, self.refs = client, ledger, list(refs)
        self.ops = (
            ["history", "context"] + (["search"] if search else []) + (["summary_history"] if summary_history else [])
        )
        self.recall = recall
        self.concurrency = concurrency
        self.pause_s = pause_s
        self.counts: Counter[tuple[str, str]] = Counter()
        self.wrong: list[str] = []
        self.untyped: list[str] = []
        self.examples: dict[str, str] = {}  # outcome -> the first error message of that class
        self.failures: list[tuple[float, str, str]] = []  # (monotonic start, op, outcome) of each probe not correct
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._rng = random.Random(7)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(), name=f"probe {i}") for i in range(self.concurrency)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _loop(self) -> None:
        while not self._stop.is_set():
            ref = self._rng.choice(self.refs)
            op = self._rng.choice(self.ops)
            if self.ledger.acked(ref):
                await self.probe(op, ref)
            await asyncio.sleep(self.pause_s)

    async def probe(self, op: str, ref: SessionRef) -> str:
        """Ask once; count and return the outcome class."""
        started = time.monotonic()
        outcome = await self._probe(op, ref)
        self.counts[(op, outcome)] += 1
        if outcome != "correct":
            self.failures.append((started, op, outcome))
        return outcome

    def failures_after(self, t: float) -> Counter[str]:
        return Counter(f"{op} {outcome}" for started, op, outcome in self.failures if started > t)

    def last_failure(self) -> float:
        return max((started for started, _, _ in self.failures), default=0.0)

    async def _probe(self, op: str, ref: SessionRef) -> str:
        started = time.monotonic()
        acked = self.ledger.acked(ref)  # a snapshot: the ledger only grows
        min_seq = acked[-1].seq
        user, session = ref
        target = None
        try:
            if op == "history":
                view = await self.client.history(user, session, strategy=ALL, min_seq=min_seq)
                problems = judge_history(view, ledger=self.ledger, ref=ref, expected=acked)
            elif op == "summary_history":  # the app's summary_buffer: checkpoint + recent events
                view = await self.client.history(user, session, min_seq=min_seq)
                problems = judge_history(view, ledger=self.ledger, ref=ref, expected=(), complete=False)
            elif op == "context":
                view = await self.client.context(
                    user, session, strategy=ALL, recall_limit=3 if self.recall else 0, min_seq=min_seq
                )
                problems = judge_context(view, ledger=self.ledger, ref=ref, expected=acked)
            else:  # search: keyword must find its target; hybrid is judged for soundness
                keyword = self._rng.random() < 0.7
                target = acked[-1] if keyword else None
                query = acked[-1].token if keyword else f"what did {session} say to remember"
                view = await self.client.search(
                    user, query, session=session, mode="keyword" if keyword else "hybrid", k=5, min_seq=min_seq
                )
                problems = judge_search(view, ledger=self.ledger, app=self.client.app, ref=ref, target=target)
        except Exception as exc:  # noqa: BLE001 - every outcome is classified
            patience = self.client.timeout + self.client.wait_ms / 1000
            outcome = classify_error(exc, elapsed=time.monotonic() - started, patience=patience)
            if outcome.startswith("untyped"):
                self.untyped.append(f"{op} {ref}: {type(exc).__name__}: {exc}")
            self.examples.setdefault(outcome, f"{op}: {exc}")
            return outcome
        if problems:
            self.wrong.append(f"{op} {ref} min_seq={min_seq}: " + "; ".join(problems))
            return "WRONG"
        return "correct"

    def table(self) -> str:
        outcomes = sorted({o for _, o in self.counts})
        ops = sorted({op for op, _ in self.counts})
        rows = [f"{'op':16}" + "".join(f"{o:>22}" for o in outcomes)]
        for op in ops:
            rows.append(f"{op:16}" + "".join(f"{self.counts[(op, o)]:>22}" for o in outcomes))
        return "\n".join(rows)
