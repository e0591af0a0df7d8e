"""`memq import`: replay an export (:mod:`.format`) into a deployment through
its normal write path, deduplicated, so that importing twice changes nothing.

The file is read twice: first every line is checked (a bad line is reported
with its number and reason and nothing is published), then each record is
published on ``MEMQ_EVENTS`` the way :class:`~memq.contracts.client.MemoryClient`
publishes (same subjects, ``Nats-Msg-Id`` headers, size limit, pipelined per
session), so persistence, indexing and summaries follow as for live traffic.

Deduplication reads the target's SQL before each session: an event, artifact
or checkpoint whose id is stored is not published again, a session that is
visible is not created again, and a final state is published only when
something of its scope was published in this run or the target's differs.
A second import of the same file therefore publishes nothing at all.

Stream sequences are the target's: a checkpoint's ``up_to_seq`` (a source
sequence) is mapped onto the target sequence of the newest event it covers.
A new session's ``session.create`` is committed before the rest of the
session is published, so the session's ``created_at`` is the exported one
(a commit stamps ``created_at`` with the newest time of its batch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client as NATS
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from memq.contracts.client import MemoryClient
from memq.contracts.errors import MemqError, NotCommitted
from memq.contracts.ids import scope_key
from memq.contracts.schemas import (
    ArtifactSaved,
    CheckpointSaved,
    EventAppended,
    SessionCreated,
    StateSet,
    StreamMessage,
)
from memq.contracts.subjects import EVENTS_STREAM
from memq.workers.memory.state import APP_PREFIX, TOMBSTONE, USER_PREFIX
from memq.workers.runtime.commit_floor import CommitFloor
from memq.workers.sql.models import (
    APP_STATE,
    ARTIFACTS,
    CHECKPOINTS,
    EVENTS,
    SESSION_STATE,
    SESSIONS,
    USER_STATE,
)
from memq.workers.transfer.format import BadLine, Footer, Header, Record, check_order, parse_line

CHUNK = 256  # messages pipelined per PubAck wait, as MemoryClient.append_many
MAX_ERRORS_SHOWN = 20


class ImportFailed(Exception):
    """The import stopped: the message says at which line and why."""


@dataclass
class Checked:
    """The result of the first pass over a file."""

    records: int = 0
    errors: list[BadLine] = field(default_factory=list)
    error_count: int = 0


@dataclass
class ImportStats:
    records: int = 0
    published: int = 0
    present: int = 0  # records already in the target, not published again
    sessions_created: int = 0


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if raw.strip():
                yield lineno, raw


def check_file(path: Path) -> Checked:
    """Every line parsed and checked; the errors of the first
    :data:`MAX_ERRORS_SHOWN` bad lines, and how many there were."""
    checked = Checked()

    def bad(error: BadLine) -> None:
        checked.error_count += 1
        if len(checked.errors) < MAX_ERRORS_SHOWN:
            checked.errors.append(error)

    seen_header = False
    footer: Footer | None = None
    last = 0
    for lineno, raw in _lines(path):
        last = lineno
        try:
            parsed = parse_line(lineno, raw)
        except BadLine as exc:
            if not seen_header:  # not an export at all: one error says so
                parsed = None
            else:
                bad(exc)
                continue
        if not seen_header and not isinstance(parsed, Header):
            bad(BadLine(lineno, "the first line must be the export header (is this a memq export?)"))
            return checked
        try:
            assert parsed is not None
            check_order(parsed, seen_header=seen_header, seen_footer=footer is not None)
        except BadLine as exc:
            bad(exc)
            continue
        if isinstance(parsed, Header):
            seen_header = True
        elif isinstance(parsed, Footer):
            footer = parsed
        else:
            checked.records += 1
    if last == 0:
        bad(BadLine(1, "the file is empty"))
    elif footer is None:
        bad(BadLine(last, "no footer after the last line: the export is incomplete (truncated?)"))
    elif footer.records != checked.records:
        bad(BadLine(footer.lineno, f"the footer counts {footer.records} records, the file holds {checked.records}"))
    return checked


def records(path: Path) -> Iterator[Record]:
    for lineno, raw in _lines(path):
        parsed = parse_line(lineno, raw)
        if isinstance(parsed, Record):
            yield parsed


def _live(rows) -> tuple[dict[str, Any], set[str]]:
    live: dict[str, Any] = {}
    deleted: set[str] = set()
    for key, value in rows:
        if value == TOMBSTONE:
            deleted.add(key)
        else:
            live[key] = orjson.loads(value)
    return live, deleted


@dataclass
class _Session:
    """What the target holds of the session being imported, and what this
    run published of it."""

    app: str
    user: str
    session: str
    visible: bool
    event_seqs: dict[str, int]  # the target's event ids -> target seq
    artifact_ids: set[str]
    checkpoint_ids: set[str]
    seq_map: dict[int, int] = field(default_factory=dict)  # source event seq -> target seq
    pending: list[tuple[Any, int | None]] = field(default_factory=list)  # (prepared message, source seq)
    published: bool = False


class Importer:
    """Publishes the records of an export into the deployment that ``nc``
    and ``engine`` reach (its NATS and its SQL, read for deduplication).

    :param durable: the persistence consumer whose ack floor says a publish
        is committed. :param stream_of: the events stream that holds an
        app's messages (sequences are per stream).
    :param commit_timeout_s: how long to wait for a commit before failing.
    """

    def __init__(
        self,
        nc: NATS,
        engine: AsyncEngine,
        *,
        stream_of: Callable[[str], str] = lambda _app: EVENTS_STREAM,
        durable: str = "memq-persistence",
        commit_timeout_s: float = 120.0,
        on_record: Callable[[], None] | None = None,
    ):
        self.nc, self.engine, self.stream_of, self.durable = nc, engine, stream_of, durable
        self.commit_timeout_s = commit_timeout_s
        self.on_record = on_record
        self.stats = ImportStats()
        self._js = nc.jetstream()
        self._clients: dict[str, MemoryClient] = {}
        self._current: _Session | None = None
        self._published_users: set[tuple[str, str]] = set()
        self._published_apps: set[str] = set()
        self._last_seq: dict[str, int] = {}  # by stream: the newest sequence published
        self._floors: dict[str, CommitFloor] = {}  # by stream: what persistence committed

    async def run(self, path: Path) -> ImportStats:
        """Import a file that :func:`check_file` found good; wait until the
        target has committed everything published."""
        for record in records(path):
            try:
                await self._record(record)
            except MemqError as exc:
                raise ImportFailed(f"line {record.lineno}: {exc.code}: {exc.message}") from exc
            self.stats.records += 1
            if self.on_record is not None:
                self.on_record()
        await self._leave_session()
        for stream, seq in self._last_seq.items():
            await self.wait_committed(stream, seq)
        return self.stats

    # --- one record -------------------------------------------------------------

    async def _record(self, record: Record) -> None:
        m = record.message
        session = getattr(m, "session", None)
        if session is None:
            await self._leave_session()
            await self._global_state(record)
            return
        s = await self._enter_session(m.app, m.user, session)
        if type(m) is SessionCreated:
            if s.visible or s.published:
                self.stats.present += 1
                return
            # Alone and committed first: the session's created_at is this message's time.
            await self._publish_now(s, m)
            stream = self.stream_of(m.app)
            await self.wait_committed(stream, self._last_seq[stream])
            s.visible = True
            self.stats.sessions_created += 1
        elif type(m) is EventAppended:
            stored = s.event_seqs.get(m.event.id)
            if stored is None:
                await self._queue(s, m, record.seq)
            else:
                self.stats.present += 1
                if record.seq is not None:
                    s.seq_map[record.seq] = stored
        elif type(m) is ArtifactSaved:
            await self._queue_unless(s, m, m.id in s.artifact_ids)
        elif type(m) is CheckpointSaved:
            if m.id in s.checkpoint_ids:
                self.stats.present += 1
                return
            await self._flush(s)  # the sequences of the events it covers
            await self._queue(s, m.model_copy(update={"up_to_seq": self._mapped(s, record, m.up_to_seq)}), None)
        elif type(m) is StateSet:
            differs = await self._session_state_differs(s, m)
            await self._queue_unless(s, m, not (s.published or differs))
        else:  # parse_line refuses every other kind
            raise ImportFailed(f"line {record.lineno}: a {m.kind!r} message cannot be imported")

    def _mapped(self, s: _Session, record: Record, up_to_seq: int) -> int:
        covered = [src for src in s.seq_map if src <= up_to_seq]
        if not covered:
            raise ImportFailed(
                f"line {record.lineno}: the checkpoint covers events up to seq {up_to_seq}, "
                "but no event of its session at or before that seq came before it in the file"
            )
        return s.seq_map[max(covered)]

    async def _global_state(self, record: Record) -> None:
        """A user's or an app's final state (a state.set without a session)."""
        m = record.message
        assert type(m) is StateSet
        user_part = {k for k in [*m.delta, *(m.delete or ())] if k.startswith(USER_PREFIX)}
        app_part = {k for k in [*m.delta, *(m.delete or ())] if k.startswith(APP_PREFIX)}
        needed = (bool(user_part) and (m.app, m.user) in self._published_users) or (
            bool(app_part) and m.app in self._published_apps
        )
        if not needed:
            async with self.engine.connect() as conn:
                if user_part:
                    q = select(USER_STATE.c.key, USER_STATE.c.value).where(
                        USER_STATE.c.user_key == scope_key(m.app, m.user)
                    )
                    live, _ = _live((USER_PREFIX + k, v) for k, v in (await conn.execute(q)).all())
                    needed |= live != {k: v for k, v in m.delta.items() if k.startswith(USER_PREFIX)}
                if app_part:
                    q = select(APP_STATE.c.key, APP_STATE.c.value).where(APP_STATE.c.app == m.app)
                    live, _ = _live((APP_PREFIX + k, v) for k, v in (await conn.execute(q)).all())
                    needed |= live != {k: v for k, v in m.delta.items() if k.startswith(APP_PREFIX)}
        if not needed:
            self.stats.present += 1
            return
        client = self._client(m.app)
        self._sent(await client._send(client._prepare(m)), m)

    async def _session_state_differs(self, s: _Session, m: StateSet) -> bool:
        if s.published:
            return True  # published anyway: no need to read
        q = select(SESSION_STATE.c.key, SESSION_STATE.c.value).where(
            SESSION_STATE.c.session_key == scope_key(s.app, s.user, s.session)
        )
        async with self.engine.connect() as conn:
            live, _ = _live((await conn.execute(q)).all())
        return live != m.delta

    # --- sessions ---------------------------------------------------------------

    async def _enter_session(self, app: str, user: str, session: str) -> _Session:
        s = self._current
        if s is not None and (s.app, s.user, s.session) == (app, user, session):
            return s
        await self._leave_session()
        key = scope_key(app, user, session)
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(select(SESSIONS.c.last_seq, SESSIONS.c.deleted_seq).where(SESSIONS.c.key == key))
            ).first()
            events = (
                await conn.execute(select(EVENTS.c.event_id, EVENTS.c.seq).where(EVENTS.c.session_key == key))
            ).all()
            artifacts = (
                await conn.execute(select(ARTIFACTS.c.artifact_id).where(ARTIFACTS.c.session_key == key))
            ).all()
            checkpoints = (
                await conn.execute(select(CHECKPOINTS.c.checkpoint_id).where(CHECKPOINTS.c.session_key == key))
            ).all()
        self._current = _Session(
            app,
            user,
            session,
            visible=row is not None and row[0] > row[1],
            event_seqs=dict(events),
            artifact_ids={a for (a,) in artifacts},
            checkpoint_ids={c for (c,) in checkpoints},
        )
        return self._current

    async def _leave_session(self) -> None:
        if self._current is not None:
            await self._flush(self._current)
        self._current = None

    # --- publishing -------------------------------------------------------------

    def _client(self, app: str) -> MemoryClient:
        if app not in self._clients:
            # verify_duplicates: an export's bytes are known to whoever holds a
            # copy, who could publish their ids first on an app of its own.
            self._clients[app] = MemoryClient(self.nc, app, timeout=30.0, verify_duplicates=True)
        return self._clients[app]

    async def _queue_unless(self, s: _Session, m: StreamMessage, present: bool) -> None:
        if present:
            self.stats.present += 1
        else:
            await self._queue(s, m, None)

    async def _queue(self, s: _Session, m: StreamMessage, source_seq: int | None) -> None:
        # The client's own checks: size limit, subject, Nats-Msg-Id (private
        # to the client, used here so the import publishes exactly as it does).
        s.pending.append((self._client(m.app)._prepare(m), source_seq))
        s.published = True
        if len(s.pending) >= CHUNK:
            await self._flush(s)

    async def _publish_now(self, s: _Session, m: StreamMessage) -> None:
        await self._queue(s, m, None)
        await self._flush(s)

    async def _flush(self, s: _Session) -> None:
        if not s.pending:
            return
        pending, s.pending = s.pending, []
        seqs = await self._client(s.app)._publish_chunk([prepared for prepared, _ in pending])
        for (_, source_seq), seq in zip(pending, seqs, strict=True):
            if source_seq is not None:
                s.seq_map[source_seq] = seq
        self.stats.published += len(seqs)
        self._published(s.app, max(seqs))
        self._published_users.add((s.app, s.user))
        self._published_apps.add(s.app)

    def _sent(self, seq: int, m: StreamMessage) -> None:
        self.stats.published += 1
        self._published(m.app, seq)
        self._published_apps.add(m.app)

    def _published(self, app: str, seq: int) -> None:
        stream = self.stream_of(app)
        self._last_seq[stream] = max(self._last_seq.get(stream, 0), seq)

    async def wait_committed(self, stream: str, seq: int) -> None:
        """Until ``seq`` on ``stream`` is committed: the persistence
        consumer's ack floor (:class:`~memq.workers.runtime.commit_floor.CommitFloor`,
        polled: the importer hears no commit notices)."""
        if stream not in self._floors:
            self._floors[stream] = CommitFloor(self._js, stream, self.durable, poll_from_s=0.005, poll_max_s=0.1)
        try:
            await self._floors[stream].wait_for(seq, self.commit_timeout_s)
        except NotCommitted as exc:
            raise ImportFailed(
                f"stream sequence {seq} was not committed within {self.commit_timeout_s:g}s ({exc.message}): "
                f"is a persistence worker running (consumer {self.durable} on {stream})?"
            ) from None
