"""The fact worker: facts about users, extracted from their turns by an LLM,
reconciled with what is known, kept in SQL generations (:mod:`.store`).

Off unless ``facts.llm`` is set: with no endpoint the kind starts, says so
and does nothing. Triggers, as the summarizer's: commit notices
(``memq.v1.changed.>``, one replica per notice by queue group) and a periodic
sweep of SQL, so a lost notice delays facts but never loses them.

Facts are derived from SQL, the source of truth, not from the stream: a
session's turns are read after its cursor (``memq_fact_cursors``), in order,
``batch_turns`` at a time. That is the replay: a new generation (a changed
model or prompt) starts every cursor at 0 and reads the same SQL, which a
forget or a delete has already emptied of what they removed, so a rebuild
cannot bring a forgotten fact back. For each batch the worker:

1. takes the session's lease (one replica per session; a crashed holder's expires);
2. asks the endpoint for candidate facts citing the batch's turns;
3. reconciles each with the user's facts: an exact duplicate merges with no
   LLM call (:func:`~memq.workers.memory.facts.predecide`), the others are
   decided by the LLM against the facts that match them; the bookkeeping is
   the pure :func:`~memq.workers.memory.facts.reconcile`;
4. writes the revisions and moves the cursor in one transaction, conditional
   on the cursor being where the batch began: a worker killed mid-batch
   leaves nothing of it, and the batch is derived again (the fact ids are
   digests, so a batch derived twice writes one fact).

Nothing is silent. A reply that does not parse or breaks the schema is asked
again (``invalid_attempts``), then dead-lettered with the reply and the
reason (``memq dlq list``), and the batch moves on without it. An endpoint
that is down or erring holds the worker: nothing is derived or skipped until
it answers (asked again after ``retry_after_s``). An app over its
``tokens_per_minute`` waits for the next minute.

Forgetting: every notice and every sweep looks for facts whose source
events SQL no longer holds (forgotten, deleted, expired; one anti-join) and
removes or re-derives them without those sources
(:func:`~memq.workers.memory.facts.without_sources`), erasing them from the
facts' history as well. A user delete drops the user's facts at once.

Generations: the fingerprint of the model and prompts names the generation
this worker fills. With none live it becomes live at once; with another live
it is built beside it (reads keep the old one), and once every session is
derived it is promoted and the old one dropped, in one transaction.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from faststream.nats import NatsRouter
from nats.micro.request import Request
from nats.micro.service import Service
from sqlalchemy import select

from memq.contracts.ids import scope_key
from memq.contracts.notices import CommitNotice
from memq.contracts.subjects import CHANGED_WILDCARD, PREFIX
from memq.workers import metrics
from memq.workers.facts import extract
from memq.workers.facts.extract import FactLLM, FactLLMError, Said, Usage
from memq.workers.facts.llm_replies import FactReplyInvalid
from memq.workers.memory.extractive import Turn
from memq.workers.memory.facts import (
    Candidate,
    Change,
    DecisionRejected,
    Fact,
    Source,
    apply,
    matching,
    predecide,
    reconcile,
    scrub,
    without_sources,
)
from memq.workers.memory.token_budget import Budget
from memq.workers.memory.tokens import event_text
from memq.workers.runtime import readiness
from memq.workers.runtime.component import Component, Live
from memq.workers.runtime.dead_letters import DeadLetters
from memq.workers.runtime.lease import Lease
from memq.workers.sql import facts as store
from memq.workers.sql import reads
from memq.workers.sql.models import FACT_GENERATIONS

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from sqlalchemy.ext.asyncio import AsyncEngine

    from memq.workers.runtime.readiness import Check
    from memq.workers.runtime.resources import Resources
    from memq.workers.settings import FactSettings

log = logging.getLogger("memq.facts")

TURN_ROLES = ("user", "assistant")  # what a user said and what they were told; not system or tool
PAGE = 200  # events read after a cursor at once
BATCHES_PER_LOOK = 5  # then the session goes to the back of the line: one long session does not starve the rest
FACTS_VERSION = 1  # bump when a change here changes what is derived (a new generation)


def _text_parts(event: dict) -> str:
    """A stored event's text parts only (storage scope ``conversational``: no tool calls, data or files)."""
    parts = (event.get("message") or {}).get("parts") or []
    return "\n".join(
        p["text"] for p in parts if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    )


class GenerationGone(Exception):
    """The generation this worker fills was dropped (another replica promoted a newer one)."""


def fingerprint(settings: FactSettings) -> str:
    """What decides the facts derived: model, structured output, prompts, sampling."""
    llm = settings.llm
    assert llm is not None
    parts = [
        FACTS_VERSION,
        llm.model,
        llm.temperature,
        llm.max_tokens,
        settings.response_format,
        settings.batch_turns,
        extract.EXTRACT_SYSTEM,
        extract.EXTRACT_PROMPT,
        extract.DECIDE_SYSTEM,
        extract.DECIDE_PROMPT,
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def generation_name(print_: str) -> str:
    return f"facts-{print_[:16]}"


@dataclass
class Stats:
    batches: int = 0
    facts_changed: int = 0
    dead_lettered: int = 0
    failures: int = 0
    skipped_busy: int = 0
    llm_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    sessions_behind: int | None = None  # at the last sweep
    promoted: list[str] = field(default_factory=list)


@dataclass
class FactLive(Live):
    engine: AsyncEngine
    llm: FactLLM | None  # None: facts are off
    generation: str | None
    dead: DeadLetters


Key = tuple[str, str, str]  # app, user, session


@dataclass
class UserLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # tasks holding or waiting for it


class FactWorker(Component[FactLive]):
    """The fact component of a worker process; see the module doc."""

    KIND = "facts"
    DESCRIPTION = "memq: facts about users, extracted by an LLM"
    NEEDS = frozenset({"sql"})

    def __init__(self, settings, *, llm: FactLLM | None = None):
        super().__init__(settings)
        self.config: FactSettings = settings.facts
        self._given = llm
        self.stats = Stats()
        self.budget = Budget(self.config.tokens_per_minute)
        self._slots = asyncio.Semaphore(self.config.max_concurrent)
        self._pending: set[Key] = set()
        self._again: set[Key] = set()
        self._retry_at: dict[Key, float] = {}
        self._held_until = 0.0  # the endpoint failed: nothing is asked before this
        self._user_locks: dict[str, UserLock] = {}  # this replica's sessions of one user, one at a time
        self._tasks: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None
        self._triggered = False

    @property
    def enabled(self) -> bool:
        return self.config.llm is not None or self._given is not None

    def router(self) -> NatsRouter:
        router = NatsRouter()
        router.subscriber(
            CHANGED_WILDCARD,
            queue=self.config.queue_group,
            title="memq.v1.changed.>:facts",
            description="Fact worker trigger: a committed session may have new turns to derive facts "
            "from, or lost events whose facts must go (one replica per notice, by queue group). "
            "A periodic sweep catches lost notices.",
        )(self.on_commit)
        return router

    async def build(self, nc: NATS, resources: Resources) -> FactLive:
        js = nc.jetstream()
        dead = DeadLetters(js, self.KIND)
        if not self.enabled:
            return FactLive(nc, js, resources.engine, None, None, dead)
        llm = self._given or FactLLM(self.config.llm, response_format=self.config.response_format)  # type: ignore[arg-type]
        print_ = fingerprint(self.config) if self.config.llm is not None else "given"
        async with resources.engine.begin() as conn:
            made = await store.ensure_generation(conn, generation_name(print_), print_)
        live = FactLive(nc, js, resources.engine, llm, made.name, dead)
        self._triggered = True
        log.info("facts: filling generation %s (%s)", made.name, made.state)
        return live

    def checks(self) -> dict[str, Check]:
        return {**super().checks(), "database": readiness.database(lambda: self.live.engine)}

    def service_options(self) -> dict:
        # `memq status` shows each instance's endpoint data: what this replica spent and how far behind it is.
        return {"stats_handler": lambda _endpoint: self.summary()}

    async def serve(self, service: Service) -> None:
        await service.add_endpoint(name="facts-stats", subject=f"{PREFIX}.facts.stats", handler=self._stats)

    async def _stats(self, request: Request) -> None:
        await request.respond(orjson.dumps(self.summary()))

    def summary(self) -> dict:
        """This replica's figures, as `memq status` shows them."""
        st = self.stats
        if not self.enabled:
            return {"facts": "off (no facts.llm)"}
        return {
            "generation": self._live.generation if self._live is not None else None,
            "llm_calls": st.llm_calls,
            "tokens_in": st.tokens_in,
            "tokens_out": st.tokens_out,
            "sessions_behind": st.sessions_behind,
            "batches": st.batches,
            "dead_lettered": st.dead_lettered,
            "failures": st.failures,
        }

    async def run(self) -> None:
        if not self.enabled:
            log.info("facts are off: no facts.llm endpoint is configured (MEMQ_FACTS__LLM__BASE_URL)")
            return
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="facts sweep")

    async def halt(self) -> None:
        self._triggered = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        llm = self._live.llm if self._live is not None else self._given
        if llm is not None:
            await llm.close()

    # --- triggers -------------------------------------------------------------------

    async def on_commit(self, notice: CommitNotice) -> None:
        if not self._triggered:
            return
        if notice.session is None:
            if notice.deleted:
                async with self.live.engine.begin() as conn:
                    await store.delete_user(conn, notice.app, notice.user)
                log.info("facts of deleted user %s/%s dropped", notice.app, notice.user)
            return
        if notice.deleted:
            async with self.live.engine.begin() as conn:
                await store.delete_cursor(conn, scope_key(notice.app, notice.user, notice.session))
        self.schedule(notice.app, notice.user, notice.session)

    def schedule(self, app: str, user: str, session: str) -> None:
        key = (app, user, session)
        if key in self._pending:
            self._again.add(key)
            return
        if self._retry_at.get(key, 0) > time.monotonic():
            return
        self._pending.add(key)
        task = asyncio.create_task(self._run(key), name=f"facts {app}/{user}/{session}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is down: the next sweep tries again
                log.warning("facts sweep failed: %s", exc)
            await asyncio.sleep(self.config.sweep_interval_s)

    async def sweep(self) -> None:
        """Schedule sessions with new events, forget lost sources, promote a finished build."""
        generation = self.live.generation
        assert generation is not None
        async with self.live.engine.connect() as conn:
            pending = await store.pending_sessions(conn, generation)
            lost = await store.users_with_lost_sources(conn, generation)
        metrics.FACT_SESSIONS_BEHIND.set(len(pending))
        self.stats.sessions_behind = len(pending)
        for app, user in lost:
            await self.forget_lost(app, user)
        for key in pending:
            self.schedule(*key)
        if not pending and not self._pending:
            await self._promote_if_built(generation)

    async def _promote_if_built(self, generation: str) -> None:
        async with self.live.engine.begin() as conn:
            state = (
                await conn.execute(select(FACT_GENERATIONS.c.state).where(FACT_GENERATIONS.c.name == generation))
            ).scalar_one_or_none()
            if state != "building" or await store.pending_sessions(conn, generation, limit=1):
                return
            dropped = await store.promote(conn, generation)
        self.stats.promoted.append(generation)
        log.info("facts generation %s is built: live now (dropped %s)", generation, ", ".join(dropped) or "none")

    # --- one session -------------------------------------------------------------------

    async def _run(self, key: Key) -> None:
        more = False
        try:
            async with self._slots:
                wait = self._held_until - time.monotonic()
                if wait > 0:
                    self._retry_at[key] = self._held_until
                    return
                more = await self.derive_session(*key)
        except FactLLMError as exc:
            # The endpoint is down or erring: hold every session, not only this one.
            self.stats.failures += 1
            metrics.FACT_BATCHES.labels("failed").inc()
            self._held_until = time.monotonic() + self.config.retry_after_s
            self._retry_at[key] = self._held_until
            log.warning("fact endpoint failed (%s); holding for %.0fs", exc, self.config.retry_after_s)
        except GenerationGone as exc:
            log.warning("%s: this replica stops deriving until restarted with the new settings", exc)
            self._triggered = False
        except Exception as exc:
            self.stats.failures += 1
            metrics.FACT_BATCHES.labels("failed").inc()
            self._retry_at[key] = time.monotonic() + self.config.retry_after_s
            log.warning("facts of %s failed (%s: %s); retrying later", key, type(exc).__name__, exc)
        finally:
            self._pending.discard(key)
        noticed = key in self._again
        self._again.discard(key)
        if (more or noticed) and self._triggered:
            self.schedule(*key)

    async def derive_session(self, app: str, user: str, session: str) -> bool:
        """Derive the session's new turns, a few batches; True when more are left."""
        session_key = scope_key(app, user, session)
        await self._forget_in_session(app, user, session_key)
        # One user at a time, across sessions and replicas: a candidate is
        # reconciled with the user's facts as they are, not as another
        # session's batch in flight will leave them (a missed contradiction).
        user_key = scope_key(app, user)
        held = self._user_locks.setdefault(user_key, UserLock())
        held.users += 1
        try:
            async with held.lock:
                return await self._derive_user_session(app, user, session, session_key, user_key)
        finally:
            held.users -= 1
            if not held.users:  # nobody holds or waits: a replica's locks do not grow with its users
                del self._user_locks[user_key]

    async def _derive_user_session(self, app: str, user: str, session: str, session_key: str, user_key: str) -> bool:
        lease = Lease(
            self.live.js,
            f"facts.{user_key}",
            ttl_s=self.config.lease_ttl_s,
            replicas=self.settings.streams.replicas,
        )
        if not await lease.acquire():
            self.stats.skipped_busy += 1  # another replica has the user: the sweep comes back
            return False
        try:
            for _ in range(BATCHES_PER_LOOK):
                done = await self._batch(app, user, session, session_key, lease)
                if done:
                    return False
            return True
        finally:
            await lease.release()

    async def _batch(self, app: str, user: str, session: str, session_key: str, lease: Lease) -> bool:
        """One batch of the session's turns; True when the session is derived to its end."""
        generation = self.live.generation
        assert generation is not None
        async with self.live.engine.connect() as conn:
            at = await store.cursor(conn, generation, session_key)
            row = await reads.session_row(conn, session_key)
            if row is None or row.last_seq <= max(at, row.deleted_seq):
                return True  # derived to its end, or deleted
            # Up to the last_seq read: an event committed meanwhile waits for the next batch.
            events = await reads.events_after(conn, session_key, at, PAGE, up_to_seq=row.last_seq)
        said, end = self._turns(session, events, row.last_seq)
        wait = self.budget.wait_s(app, time.monotonic())
        if said and wait > 0:
            metrics.FACT_BATCHES.labels("over_budget").inc()
            self._retry_at[(app, user, session)] = time.monotonic() + wait
            return True
        changes: list[Change] = []
        if said:
            changes = await self._derive(app, user, session, said, end, generation)
        if lease.lost.is_set():
            return True  # another replica holds the session now: it derives this batch
        user_key = scope_key(app, user)
        try:
            async with self.live.engine.begin() as conn:
                await self._check_generation(conn, generation)
                # A forget or delete committed while the LLM was asked: forget first, then derive
                # the batch again from what SQL holds now; never write a fact with a gone source.
                gone = bool(await store.missing_sources(conn, [c.fact for c in changes]))
                if not gone:
                    await store.commit_batch(
                        conn, generation, changes, session_key=session_key, user_key=user_key, from_seq=at, to_seq=end
                    )
        except store.CursorMoved as exc:
            log.info("%s: dropped a batch another replica derived", exc)
            return True
        if gone:
            log.info("a source of a batch of %s/%s/%s went meanwhile: derived again", app, user, session)
            await self.forget_lost(app, user)
            return False
        for change in changes:
            metrics.FACT_CHANGES.labels(change.kind).inc()
        self.stats.batches += 1
        self.stats.facts_changed += len(changes)
        metrics.FACT_BATCHES.labels("derived").inc()
        return end >= row.last_seq

    def _turns(self, session: str, events: list, last_seq: int) -> tuple[list[Said], int]:
        """Up to ``batch_turns`` turns with text from ``events``, and the seq
        the batch ends at (the last turn's, or the page's end when no turn is left)."""
        said: list[Said] = []
        end = events[-1].seq if len(events) == PAGE else last_seq
        # The index's storage scope binds facts too: what is not kept for recall is not mined for facts.
        scope = self.settings.indexing.storage_scope
        if scope == "summaries_only":
            return said, end
        for event in events:
            if event.role not in TURN_ROLES:
                continue
            text = _text_parts(event.data) if scope == "conversational" else event_text(event.data)
            if not text.strip():
                continue
            if len(said) == self.config.batch_turns:
                end = said[-1].source.seq
                break
            ts = event.timestamp
            said.append(Said(Source(event.seq, session, event.event_id, ts), Turn(event.author, text, ts)))
        return said, end

    async def _derive(
        self, app: str, user: str, session: str, said: list[Said], end: int, generation: str
    ) -> list[Change]:
        """The changes a batch makes: extract, then reconcile each candidate."""
        llm = self.live.llm
        assert llm is not None
        candidates = await self._asked(
            lambda spent: llm.extract(app, user, said, spent=spent),
            "extract",
            app,
            user,
            session,
            end,
            what="the extraction",
        )
        if not candidates:
            return []
        async with self.live.engine.connect() as conn:
            facts = await store.user_facts(conn, generation, app, user)
        changes: list[Change] = []
        for candidate in candidates:
            made = await self._reconciled(facts, candidate, app, user, session, end)
            facts = apply(facts, made)
            changes += made
        return changes

    async def _reconciled(
        self, facts: dict[str, Fact], candidate: Candidate, app: str, user: str, session: str, end: int
    ) -> list[Change]:
        decision = predecide(facts, candidate)
        if decision is None:
            llm = self.live.llm
            assert llm is not None
            shown = matching(facts, candidate)
            decision = await self._asked(
                lambda spent: llm.decide(candidate, shown, spent=spent),
                "decide",
                app,
                user,
                session,
                end,
                what="a decision",
            )
            if decision is None:
                return []
        try:
            return reconcile(facts, candidate, decision)
        except DecisionRejected as exc:
            await self._dead_letter(app, user, session, end, "fact_decision_rejected", str(exc), candidate.statement)
            return []

    async def _asked(self, call, name: str, app: str, user: str, session: str, end: int, *, what: str):
        """``call()`` asked up to ``invalid_attempts`` times while its reply is
        invalid; None (dead-lettered) when every reply was. FactLLMError goes up."""
        invalid: FactReplyInvalid | None = None
        for _ in range(self.config.invalid_attempts):
            spent: list[Usage] = []
            try:
                return await call(spent)
            except FactReplyInvalid as exc:
                invalid = exc
            finally:
                self._count_usage(app, name, spent)
        assert invalid is not None
        await self._dead_letter(app, user, session, end, "fact_reply_invalid", f"{what}: {invalid.reason}", invalid.raw)
        return None

    def _count_usage(self, app: str, name: str, spent: list[Usage]) -> None:
        used = sum(spent, Usage())
        self.stats.llm_calls += used.calls
        self.stats.tokens_in += used.prompt_tokens
        self.stats.tokens_out += used.completion_tokens
        metrics.FACT_LLM_CALLS.labels(name).inc(used.calls)
        metrics.FACT_LLM_TOKENS.labels("prompt").inc(used.prompt_tokens)
        metrics.FACT_LLM_TOKENS.labels("completion").inc(used.completion_tokens)
        self.budget.spend(app, used.prompt_tokens + used.completion_tokens, time.monotonic())

    async def _dead_letter(self, app: str, user: str, session: str, end: int, code: str, reason: str, body: str):
        self.stats.dead_lettered += 1
        metrics.FACT_BATCHES.labels("dead_lettered").inc()
        # Not an event subject: `memq dlq replay` leaves it (a new generation derives the batch again).
        subject = f"{PREFIX}.facts.{scope_key(app, user, session)}"
        reason = f"{app}/{user}/{session} up to seq {end}: {reason}"
        await self.live.dead.send_data(body.encode(), code, reason, subject, "facts", end)

    async def _check_generation(self, conn, generation: str) -> None:
        found = await conn.execute(select(FACT_GENERATIONS.c.name).where(FACT_GENERATIONS.c.name == generation))
        if found.scalar_one_or_none() is None:
            raise GenerationGone(f"facts generation {generation} was dropped")

    # --- forgetting --------------------------------------------------------------------

    async def _forget_in_session(self, app: str, user: str, session_key: str) -> None:
        generation = self.live.generation
        assert generation is not None
        async with self.live.engine.connect() as conn:
            lost = await store.lost_in_session(conn, generation, session_key)
        if lost:
            await self.forget_lost(app, user)

    async def forget_lost(self, app: str, user: str) -> None:
        """Remove, or keep without them, the user's facts' sources that SQL no longer holds."""
        generation = self.live.generation
        assert generation is not None
        async with self.live.engine.begin() as conn:
            facts = await store.user_facts(conn, generation, app, user)
            missing = await store.missing_sources(conn, facts.values())
            if not missing:
                return
            changes = without_sources(facts, missing)
            for change in changes:
                if change.kind == "sources_dropped":
                    history = await store.revisions(conn, generation, change.fact.id)
                    log_ = scrub([Change(r.kind, r.fact) for r in history], missing)  # type: ignore[arg-type]
                    when = {r.fact.revision: r.written_at for r in history}
                    kept = [store.Revision(c.kind, c.fact, when[c.fact.revision]) for c in log_]
                    await store.rewrite_history(conn, generation, change.fact.id, kept)
            await store.commit_batch(conn, generation, changes)
        for change in changes:
            metrics.FACT_CHANGES.labels(change.kind).inc()
        log.info("facts of %s/%s: %d sources gone, %d revisions", app, user, len(missing), len(changes))
