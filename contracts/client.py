"""The async client an agent uses to write into memq (docs/design.md: Shape, Guarantees).

Every write is one message on ``MEMQ_EVENTS``. A method returns once JetStream
has acknowledged it, with its stream sequence: the message's position in the
session and the token a read-your-writes query waits for. Each message carries
``Nats-Msg-Id`` (:func:`~memq.contracts.subjects.dedupe_id`: the session's
subject, the event or message id and a digest of the message's bytes), so a
retried publish inside the stream's duplicate window gets the original sequence
back instead of a copy.

Ids belong to their session: the same id in another app, user or session is
another message, never a duplicate. A duplicate ack (``PubAck.duplicate``,
counted in :attr:`MemoryClient.duplicates`) therefore means this very message
(same session, id and bytes) was stored before: the caller's own retry, a
success with the original sequence. The same id with other content in the same
session is not a duplicate for JetStream: it is stored in the stream, and the
persistence worker keeps the first one and dead-letters the other (code
``duplicate_id``, with both sequences in the reason), within the duplicate
window or after it alike. Give each new event a new id (the default).

A publish whose outcome is unknown (no PubAck within ``timeout``, the
connection lost while nats-py reconnects) may have been stored, so the client
settles it itself: it publishes the same message again, same ``Nats-Msg-Id``,
backing off and waiting longer for each try's ack (a loaded server is not
sent the same messages every ``timeout``), until JetStream acknowledges it (a
duplicate's ack carries the original sequence) or ``publish_deadline`` (30 s)
has passed; then
:class:`~memq.contracts.errors.PublishOutcomeUnknown`, after which publishing the
same event again is safe and a new one may duplicate it.

Bad input fails before any I/O: :class:`~memq.contracts.errors.InvalidId`,
:class:`~memq.contracts.errors.InvalidMessage` or :class:`~memq.contracts.errors.Oversize`.
Other NATS failures (a refusal, no stream) become
:class:`~memq.contracts.errors.PublishFailed` at once.

Appends take ``expect_seq``: optimistic concurrency in the broker. The
publish carries ``Nats-Expected-Last-Subject-Sequence`` and JetStream stores
it only if the session subject's last message (of any kind: events, the
session's creation, state sets with a session, artifacts, the summarizer's
checkpoints) has that sequence (``0``: no message yet); otherwise
:class:`~memq.contracts.errors.Conflict`, with the sequence the server has.

A session is its events: by default an append to a session that does not
exist starts it. ``create=False`` refuses that append with
:class:`~memq.contracts.errors.NotFound`, and a delete of a session or user
that does not exist raises it unless ``missing_ok=True``; both check with one
``consistency="any"`` read before publishing (docs/guide/client.md, "Sessions
that do not exist", says what that read cannot see).

Reads (:meth:`MemoryClient.get_session`, :meth:`~MemoryClient.history`,
:meth:`~MemoryClient.context`, …) are core-NATS requests to the query service
(:mod:`memq.contracts.queries`) with typed replies; a refused request raises the
service's typed error (:class:`~memq.contracts.errors.NotFound`,
:class:`~memq.contracts.errors.Forbidden`, …) and no answer at all raises
:class:`~memq.contracts.errors.Unavailable`. By default every read carries the
sequence of this client's last publish, so it sees the client's own writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.js.object_store import ObjectStore
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from memq.contracts.carry import RecentWrites
from memq.contracts.codec import DEFAULT_MAX_BYTES, encode, event_encoder, msg_id, subject_for
from memq.contracts.connection import DEFAULT_RECONNECT_ATTEMPTS, connect_nats
from memq.contracts.errors import (
    Conflict,
    Forbidden,
    InvalidMessage,
    InvalidRequest,
    MemqError,
    NotFound,
    Oversize,
    PublishFailed,
    Unavailable,
    WrongEventLoop,
    validation_details,
)
from memq.contracts.ids import encode_token, validate_id
from memq.contracts.local import LocalReads
from memq.contracts.queries import (
    OPS,
    ArtifactsView,
    ArtifactView,
    Consistency,
    ContextFormat,
    ContextView,
    FactHistoryView,
    FactsView,
    HistoryView,
    ProfileView,
    Role,
    SearchMode,
    SearchResults,
    SearchRole,
    SessionInfo,
    SessionsPage,
    SessionView,
    StateView,
    StoredEvent,
    StrategySpec,
)
from memq.contracts.replies import parse_reply
from memq.contracts.schemas import (
    USER_PREFIX,
    ArtifactSaved,
    Event,
    EventAppended,
    EventForgotten,
    Message,
    ObjectRef,
    SessionCreated,
    SessionDeleted,
    StateSet,
    TextPart,
    UserDeleted,
    new_id,
    user_scoped,
    user_scoped_delta,
)
from memq.contracts.settle import PUBLISH_DEADLINE, Prepared, PublishSettling, expecting
from memq.contracts.subjects import (
    ARTIFACT_BUCKET,
    EVENTS_STREAM,
    app_events_stream,
    artifact_object_name,
    dedupe_id,
    request_subject,
    status_subject,
)

CARRIES = ("history", "context")  # the reads that take the caller's carried writes (memq.contracts.carry)
MAX_IN_FLIGHT = 1000  # unacknowledged publishes per append_many chunk
HELD_MANY = 16  # append_many to a session local_reads holds: up to this many events go one by one, conditionally
# The server counts headers in max_payload and drops the connection of a client
# that exceeds it; ours (message id, expected stream) stay well below this.
HEADER_ROOM = 1024
After = float | datetime | timedelta | None
Strategy = StrategySpec | dict[str, Any] | None
ModelFn = Callable[[list[dict[str, Any]]], Any]  # messages -> str | obj with .content (or an awaitable of it)


def unix_time(after: After) -> float | None:
    """Unix seconds of an ``after`` filter: a number as is, a datetime (naive
    = local time, as :meth:`datetime.datetime.timestamp` reads it), a timedelta as
    that long before now."""
    if after is None or isinstance(after, (int, float)):
        return after
    if isinstance(after, timedelta):
        return time.time() - after.total_seconds()
    if isinstance(after, datetime):
        return after.timestamp()
    raise TypeError(f"after must be unix seconds, a datetime or a timedelta, not {type(after).__name__}")


def event_filters(after: After, roles: Sequence[str]) -> dict[str, Any]:
    """The ``after``/``roles`` fields of a request, only those set (a query
    service older than these filters still answers unfiltered requests)."""
    fields: dict[str, Any] = {}
    if after is not None:
        fields["after"] = unix_time(after)
    if roles:
        fields["roles"] = list(roles)
    return fields


def app_inbox_prefix(app: str) -> str:
    """The reply-subject prefix of an app's connections: ``_INBOX_<app token>``.

    NATS permissions fence each app to its own inbox; with the shared
    ``_INBOX.>`` any app allowed to subscribe there could read every other
    app's replies. :meth:`MemoryClient.connect` uses it by default; a caller
    that connects itself passes ``inbox_prefix=app_inbox_prefix(app)``.
    """
    return f"_INBOX_{encode_token(app, 'app')}"


@dataclass(frozen=True, slots=True)
class SessionRef:
    """A session and the stream sequence of the message that created it."""

    app: str
    user: str
    session: str
    seq: int


# --- the query wire format (pure: no I/O) ---------------------------------------


def build_request(app: str, op: str, **fields: Any) -> Any:
    """Validate one request of ``op`` (a key of :data:`memq.contracts.queries.OPS`).

    Raises :class:`~memq.contracts.errors.InvalidId` for a bad app, user or session
    id, :class:`~memq.contracts.errors.InvalidRequest` for anything else.
    """
    if op not in OPS:
        raise InvalidRequest(f"unknown query {op!r}; known: {', '.join(OPS)}")
    validate_id(app, "app")
    for what in ("user", "session"):
        if fields.get(what) is not None:
            validate_id(fields[what], what)
    try:
        return OPS[op].request(app=app, **fields)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid {op} request: {validation_details(exc)}") from None


def encode_request(request: BaseModel) -> bytes:
    """The wire body of a request: its JSON without unset (``None``) fields."""
    try:
        return request.model_dump_json(exclude_none=True).encode()
    except PydanticSerializationError as exc:  # e.g. a lone surrogate in a string
        raise InvalidRequest(f"request cannot be encoded as JSON: {exc}") from None


class MemoryClient(PublishSettling):
    """Publishes session events, state, artifacts and deletes for one app, and
    reads sessions, history and model context back from the query service.

    :param nc: a connected nats-py client; the caller keeps ownership of it
        (use :meth:`connect` for a client that owns its connection).
    :param app: the app id; every message is published under it.
    :param timeout: seconds the first try of a publish waits for its PubAck
        (per chunk in :meth:`append_many`); after a try that got no answer in
        time, the next waits twice as long, within ``publish_deadline``.
        Default 5.0.
    :param publish_deadline: seconds after a publish's first try during
        which one whose outcome is unknown (no PubAck in time, the connection
        lost) is tried again with the same message. Default 30.0; 0 for one
        try only. ``publish_deadline`` plus a try or two (``timeout`` each)
        must stay below the stream's duplicate window
        (``streams.duplicate_window_s``, 120 s by default), or a retry could
        store a second copy.
    :param inline_artifact_limit: artifacts up to this many bytes travel inline
        in the message; larger ones go to the object store. Default 256 KiB.
    :param max_message_bytes: encoded messages above this size raise
        :class:`~memq.contracts.errors.Oversize` before publishing. Default 1 MiB (the workers'
        limit), capped by the server's ``max_payload`` minus ``HEADER_ROOM``.
    :param stream: the stream expected to capture the events. Default:
        ``MEMQ_EVENTS``, or the app's own ``MEMQ_EVENTS_<app>`` where the
        deployment gives each app one (the first refusal that says the
        subject is in another stream switches to it, and nothing was stored).
    :param consistent: read-your-writes by default. Default True: every read
        without an explicit ``min_seq`` carries :attr:`last_seq`, so the query
        service answers only once this client's own writes are committed (or
        fails with :class:`~memq.contracts.errors.NotCommitted`). False: reads do
        not wait.
    :param wait_ms: how long the service may wait for ``min_seq`` to be
        committed. Default 2000. A read times out after ``timeout + wait_ms``.
    :param consistency: whose writes a read sees. Default ``"own"``: this
        client's (``min_seq``, above). ``"any"``: also every write that any
        other client (another process, the HTTP gateway) had acknowledged
        before the read began, in the read's scope (the user's sessions and
        state; an app-wide listing: the app). The query service looks up the
        newest acknowledged sequence on those subjects and answers once it is
        committed (indexed, for a search): one JetStream lookup more per read,
        and a wait for other writers' commits. Every read method takes
        ``consistency=`` to override it per call.
    :param carry_writes: with ``"own"`` consistency, a history or context
        read carries this client's own writes to the session that may not be
        committed yet (``memq.contracts.carry``), and the service answers
        without waiting for their commit where that is exact (it waits as
        before where not). Default True.
    :param verify_duplicates: read back the message a duplicate ack points
        at, and publish again under a fresh id if it is not this one
        (:func:`~memq.contracts.landing.publish_landed`; counted in
        ``squatted``). Needs a connection that may read the stream
        (``memq import`` sets it, as ``admin``); an app's own user may not,
        and relies on the id's content digest. Default False.
    :param local_reads: the session windows this client holds, to answer a
        read right after its own append without a request
        (``memq.workers.memory.local.LocalWindows()``; see
        :mod:`memq.contracts.local` for what it answers and why that is
        exact). Appends to a session it holds are then published with
        ``expect_seq`` (a refusal only drops the window: the append is
        published again without it). Default None: every read is a request.

    :attr:`last_seq` is the stream sequence of this client's latest publish
    (``None`` before the first).
    """

    def __init__(
        self,
        nc: Client,
        app: str,
        *,
        timeout: float = 5.0,
        publish_deadline: float = PUBLISH_DEADLINE,
        inline_artifact_limit: int = 256 * 1024,
        max_message_bytes: int = DEFAULT_MAX_BYTES,
        stream: str | None = None,
        consistent: bool = True,
        wait_ms: int = 2000,
        consistency: Consistency = "own",
        carry_writes: bool = True,
        verify_duplicates: bool = False,
        local_reads: LocalReads | None = None,
    ):
        self.app = validate_id(app, "app")
        self.nc = nc
        self.timeout = timeout
        self.publish_deadline = publish_deadline
        self.inline_artifact_limit = inline_artifact_limit
        self.max_message_bytes = max_message_bytes
        # Where the app's events go: MEMQ_EVENTS, or the app's own stream
        # where the deployment gives it one (tried second, then kept).
        self._streams = (stream,) if stream is not None else (EVENTS_STREAM, app_events_stream(self.app))
        self.stream = self._streams[0]
        self.consistent = consistent
        self.wait_ms = wait_ms
        self.consistency = consistency
        self._recent = RecentWrites() if carry_writes else None
        self.local_reads = local_reads
        if local_reads is not None:
            local_reads.bind(self.app)
        self.last_seq: int | None = None
        # Publishes JetStream answered as duplicates: retries of a message it
        # already had (same subject, id and bytes), each a success.
        self.duplicates = 0
        self.verify_duplicates = verify_duplicates
        # Duplicate acks that were another message's (verify_duplicates), each published again
        self.squatted = 0
        self._js = nc.jetstream(timeout=timeout)
        self._objects: ObjectStore | None = None
        self._owns_connection = False
        # The event loop the connection serves: connect()'s, or the first call's.
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def connect(
        cls,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        *,
        app: str,
        timeout: float = 5.0,
        publish_deadline: float = PUBLISH_DEADLINE,
        inline_artifact_limit: int = 256 * 1024,
        max_message_bytes: int = DEFAULT_MAX_BYTES,
        stream: str | None = None,
        consistent: bool = True,
        wait_ms: int = 2000,
        consistency: Consistency = "own",
        carry_writes: bool = True,
        local_reads: LocalReads | None = None,
        connect_timeout: float = 2.0,
        max_reconnect_attempts: int = DEFAULT_RECONNECT_ATTEMPTS,
        **nats_options: Any,
    ) -> MemoryClient:
        """Connect to NATS and return a client that closes the connection on
        :meth:`close`. The other parameters are those of the constructor.

        The first connect fails fast: each server is tried twice (the second
        ``reconnect_time_wait``, 2 s by default, after the first), then
        :class:`~memq.contracts.connection.NatsUnreachable` (an
        :class:`~memq.contracts.errors.Unavailable`) says which URL failed and
        why, without nats-py's per-try tracebacks.

        :param servers: a URL, comma-separated URLs, or a list of them.
            Default ``nats://127.0.0.1:4222``.
        :param connect_timeout: seconds for each TCP/TLS connect. Default 2.0.
        :param max_reconnect_attempts: once connected, how often to try each
            server again after losing it (a NATS restart). Default 60
            (2 s apart: about two minutes); -1 for a long-running agent that
            should wait out any outage; ``allow_reconnect=False`` to fail at
            once instead.
        :param nats_options: any other :func:`nats.connect` option (auth,
            TLS, ``reconnect_time_wait``, ``error_cb``, callbacks).
        """
        validate_id(app, "app")  # fail before opening a connection
        nats_options.setdefault("name", f"memq-client:{app}")
        nats_options.setdefault("inbox_prefix", app_inbox_prefix(app))  # what app users may subscribe to
        nc = await connect_nats(
            servers, connect_timeout=connect_timeout, max_reconnect_attempts=max_reconnect_attempts, **nats_options
        )
        client = cls(
            nc,
            app,
            timeout=timeout,
            publish_deadline=publish_deadline,
            inline_artifact_limit=inline_artifact_limit,
            max_message_bytes=max_message_bytes,
            stream=stream,
            consistent=consistent,
            wait_ms=wait_ms,
            consistency=consistency,
            carry_writes=carry_writes,
            local_reads=local_reads,
        )
        client._owns_connection = True
        client._loop = asyncio.get_running_loop()
        return client

    def _on_its_loop(self) -> None:
        """Refuse a call from another event loop at once: nats-py's
        connection answers only the loop it was opened on, and from another
        a request would wait out its timeout and read as "no service"."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise WrongEventLoop(
                f"this MemoryClient (app {self.app!r}) is connected on another event loop than the one calling it, "
                "e.g. from another thread's asyncio.run or a framework's run_sync; its NATS connection serves only "
                "its own loop: connect a client in this loop, or run the call on the client's loop "
                "(asyncio.run_coroutine_threadsafe)"
            )

    async def close(self) -> None:
        """Close the connection if this client opened it (flushing pending data)."""
        if self._owns_connection and not self.nc.is_closed:
            await self.nc.close()

    async def __aenter__(self) -> MemoryClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- sessions and events --------------------------------------------------

    async def create_session(self, user: str, session: str | None = None, state: dict | None = None) -> SessionRef:
        """Create a session.

        :param user: the user id.
        :param session: the session id; default a new time-ordered id.
        :param state: initial state (keys may carry ``user:``/``app:``/``temp:``
            prefixes); default empty.
        """
        session = new_id() if session is None else session
        message = self._build(SessionCreated, user=user, session=session, state=state or {})
        return SessionRef(self.app, message.user, message.session, await self._publish(message))

    async def append(
        self, user: str, session: str, event: Event, *, expect_seq: int | None = None, create: bool = True
    ) -> int:
        """Append one event to a session; return its stream sequence.

        :param create: an append to a session that does not exist (never
            created, or deleted) starts it, as its first event: a session is
            its events. Default True. False: such an append raises
            :class:`~memq.contracts.errors.NotFound` and publishes nothing.
            The check is one query-service read with ``consistency="any"``:
            it sees every write any client had acknowledged before it (a
            creation, another writer's append, a delete). A delete
            acknowledged between that read and the append is not seen, and
            the append starts the session again; with ``expect_seq`` too the
            broker refuses it (the delete moved the session's last sequence).

        :param expect_seq: append only if the session's last message (of any
            kind) is the one at this stream sequence, ``0`` for a session
            subject without any message yet; else raise
            :class:`~memq.contracts.errors.Conflict` (its ``last_seq`` is the
            sequence the server has). Default ``None``: no check.

        With ``expect_seq``, a publish repeated after its first try was stored
        is refused too (nats-server 2.15 checks the expected sequence before
        the ``Nats-Msg-Id`` dedupe): ``Conflict.last_seq`` is then the stored
        event's own sequence, unless another writer appended after it.
        """
        message = self._build(EventAppended, user=user, session=session, event=event)
        if not create:
            await self._require_session(user, session, "nothing appended")
        if self.local_reads is None:
            return await self._publish(message, expect_seq)
        return await self._append_held(message, expect_seq)

    async def _append_held(self, message: EventAppended, expect_seq: int | None) -> int:
        """:meth:`append` with :attr:`local_reads`: conditional on the held
        window's sequence unless the caller gave its own; the window grows by
        the event when the ack proves nothing else came between."""
        local, user, session = self.local_reads, message.user, message.session
        assert local is not None
        held = local.expect(user, session)
        expect = expect_seq if expect_seq is not None else held
        duplicates = self.duplicates
        try:
            seq = await self._publish(message, expect, local=False)
        except Conflict:
            local.forget(user, session)
            if expect_seq is not None:
                raise
            # The check was ours, not the caller's: append after whoever came first.
            return await self._publish(message)
        except BaseException:
            local.wrote(message)  # outcome unknown, or refused: nothing is known of the session
            raise
        if self.duplicates != duplicates:  # stored before: its place is not after the window
            local.wrote(message, seq)
        else:
            local.appended(user, session, expect, seq, message.event)
        return seq

    async def append_text(
        self,
        user: str,
        session: str,
        role: Role,
        text: str,
        author: str | None = None,
        *,
        expect_seq: int | None = None,
        create: bool = True,
    ) -> int:
        """Append a one-part text message.

        :param role: ``user``, ``assistant``, ``system`` or ``tool``.
        :param author: default ``"user"`` for the user role, else the app id.
        :param expect_seq: as in :meth:`append`. Default ``None``: no check.
        :param create: as in :meth:`append`. Default True.
        """
        author = author if author is not None else ("user" if role == "user" else self.app)
        try:
            event = Event(author=author, message=Message(role=role, parts=[TextPart(text=text)]))
        except ValidationError as exc:  # a bad role or text: typed, like every other method
            raise InvalidMessage(f"invalid text event: {validation_details(exc)}") from None
        return await self.append(user, session, event, expect_seq=expect_seq, create=create)

    async def append_many(
        self,
        user: str,
        session: str,
        events: Sequence[Event],
        *,
        expect_seq: int | None = None,
        create: bool = True,
    ) -> list[int]:
        """Append events in order; return their sequences in input order.

        Every event is validated and encoded before the first publish, so bad
        input publishes nothing. Publishes are pipelined, at most
        ``MAX_IN_FLIGHT`` unacknowledged at a time. If a chunk fails, earlier
        chunks stay published; retrying the whole call is safe (dedupe by id),
        except with ``expect_seq`` (see :meth:`append`).

        The events of a chunk left unacknowledged by a lost ack or connection
        are published again, in order, until acknowledged (as for every
        publish): each event is stored exactly once, but one whose first
        publish was lost lands after the later events of its chunk that were
        stored, out of input order. The sequences returned say where each
        event landed; they increase unless an interruption reordered them.

        :param expect_seq: as in :meth:`append`, carried by the *first* event
            only: if it is refused nothing is published; the others follow it
            unchecked (another writer's message may land between them).
            Default ``None``: no check.
        :param create: as in :meth:`append`, checked once before the first
            event. Default True.
        """
        prepared = self._prepare_events(user, session, events)
        if not prepared:
            return []
        if not create:
            await self._require_session(user, session, "nothing appended")
        if (
            self.local_reads is not None
            and expect_seq is None
            and len(prepared) <= HELD_MANY
            and all(type(e) is Event for e in events)
            and self.local_reads.expect(user, session) is not None
        ):
            # A turn's few events to a held session: one conditional append
            # each (awaited in turn, not pipelined), so the window grows by each.
            return [
                await self._append_held(self._build(EventAppended, user=user, session=session, event=e), None)
                for e in events
            ]
        prepared[0] = expecting(prepared[0], expect_seq)
        try:
            # The first alone: refused (expect_seq, a missing stream), nothing else is published.
            seqs = [await self._send(prepared[0])]
            for start in range(1, len(prepared), MAX_IN_FLIGHT):
                seqs += await self._publish_chunk(prepared[start : start + MAX_IN_FLIGHT])
        finally:
            if self.local_reads is not None:  # others' messages may land between them: no window grows
                self._held_wrote_many(user, session, events)
        if self._recent is not None:
            for event, seq, (_, data, _) in zip(events, seqs, prepared, strict=True):
                # A dict was built into an Event with ids of its own: not carried, its read waits.
                self._recent.wrote(user, session, seq, "event", event if type(event) is Event else None, len(data))
        return seqs

    def _held_wrote_many(self, user: str, session: str, events: Sequence[Event]) -> None:
        assert self.local_reads is not None
        self.local_reads.forget(user, session)
        for event in events:
            delta = (
                event.actions.state_delta if isinstance(event, Event) else event.get("actions", {}).get("state_delta")
            )
            if any(":" in k for k in delta or ()):  # user: or app: keys: other sessions' state changes
                built = event if isinstance(event, Event) else Event.model_validate(event)
                self.local_reads.wrote(
                    EventAppended.model_construct(app=self.app, user=user, session=session, event=built)
                )

    async def set_state(self, user: str, delta: dict, session: str | None = None) -> int:
        """Apply a state delta outside any event.

        :param session: default ``None``: then only ``user:``, ``app:`` and
            ``temp:`` keys are allowed.
        """
        scope = {} if session is None else {"session": session}
        return await self._publish(self._build(StateSet, user=user, delta=delta, **scope))

    async def delete_state(self, user: str, keys: Sequence[str], session: str | None = None) -> int:
        """Delete state keys (with their scope prefix: none = session,
        ``user:``, ``app:``); return the message's sequence.

        Deletes are ordered with sets by stream sequence: a later
        :meth:`set_state` (or event ``state_delta``) creates the key again,
        an earlier one never brings it back. Deleting a missing key is a no-op.
        (A ``None`` value in a delta is stored as JSON ``null``; it does not delete.)

        :param keys: the keys to delete; a ``str`` is one key.
        :param session: default ``None``: then only ``user:``, ``app:`` and
            ``temp:`` keys are allowed.
        """
        keys = [keys] if isinstance(keys, str) else list(keys)
        scope = {} if session is None else {"session": session}
        return await self._publish(self._build(StateSet, user=user, delta={}, delete=keys, **scope))

    async def set_user_state(self, user: str, delta: dict) -> int:
        """Set the user's state, outside any session: a key without a prefix
        means the user's (``{"lang": "fr"}`` sets ``user:lang``); ``user:``,
        ``app:`` and ``temp:`` keys are taken as they are. Reads show the
        keys prefixed (:meth:`get_state`: ``{"user:lang": "fr"}``), as every
        session of the user sees them."""
        validate_id(user, "user")
        try:
            scoped = user_scoped_delta(delta)
        except ValueError as exc:
            raise InvalidMessage(f"invalid StateSet: {exc}") from None
        return await self.set_state(user, scoped)

    async def delete_user_state(self, user: str, keys: Sequence[str]) -> int:
        """Delete keys of the user's state; unprefixed keys mean ``user:``
        ones, as in :meth:`set_user_state`."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        return await self.delete_state(user, [user_scoped(k) for k in keys])

    async def save_artifact(
        self, user: str, session: str, filename: str, data: bytes, mime_type: str = "application/octet-stream"
    ) -> int:
        """Save a new version of an artifact; return the message's sequence.

        Up to ``inline_artifact_limit`` bytes travel inline; larger data is put
        into the ``MEMQ_ARTIFACTS`` object store first and referenced by name,
        size and SHA-256. The message is built and checked before any upload.
        """
        validate_id(user, "user")  # both name the object: check them before anything else
        validate_id(session, "session")
        artifact_id = new_id()
        fields = dict(user=user, session=session, id=artifact_id, filename=filename, mime_type=mime_type)
        if len(data) <= self.inline_artifact_limit:
            return await self._publish(self._build(ArtifactSaved, inline=bytes(data), **fields))
        name = artifact_object_name(self.app, user, session, artifact_id)
        digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())  # ~0.1 s per 64 MiB
        ref = ObjectRef(bucket=ARTIFACT_BUCKET, name=name, size=len(data), sha256=digest)
        message = self._build(ArtifactSaved, object=ref, **fields)
        prepared = self._prepare(message)
        await self._put_object(name, data)
        if self.local_reads is not None:
            self.local_reads.wrote(message)  # before: an artifact changes the session's last sequence
        return await self._send(prepared)

    async def delete_session(self, user: str, session: str, *, missing_ok: bool = False) -> int:
        """Delete a session everywhere (SQL, index, cache, stream, artifacts);
        return the delete's sequence.

        :param missing_ok: default False: a session that does not exist
            (never created, or deleted already) raises
            :class:`~memq.contracts.errors.NotFound` and nothing is published
            (checked with one query-service read first). True: publish the
            delete without asking (idempotent, and no query service needed);
            deleting nothing is then a no-op for the workers.
        """
        message = self._build(SessionDeleted, user=user, session=session)
        if not missing_ok:
            await self._require_session(user, session, "nothing deleted")
        return await self._publish(message)

    async def forget_event(
        self, user: str, session: str, seq: int, *, missing_ok: bool = False, expect_seq: int | None = None
    ) -> int:
        """Forget one event of a session everywhere (SQL, index, cache,
        stream), as :meth:`delete_session` does a whole session; return the
        forget's sequence. ``seq`` is the event's stream sequence (a stored
        event's ``seq``, a search hit's ``seq``). A checkpoint whose summary
        already folded the event keeps its summary.

        :param missing_ok: default False: a ``seq`` that is not an event of
            this session (never was, another session's or user's, forgotten
            already) raises :class:`~memq.contracts.errors.NotFound` and
            nothing is published (checked with one query-service read
            first). True: publish without asking; the workers then forget
            nothing unless the event is this session's.
        :param expect_seq: as in :meth:`append`: publish only while the
            session's last sequence is this one (else
            :class:`~memq.contracts.errors.Conflict`).
        """
        if type(seq) is not int or seq <= 0:  # bool is no sequence either
            raise InvalidMessage(f"invalid EventForgotten: seq must be a positive integer, not {seq!r}")
        message = self._build(EventForgotten, user=user, session=session, seq=seq)
        if not missing_ok:
            await self._require_event(user, session, seq)
        return await self._publish(message, expect_seq)

    async def _require_event(self, user: str, session: str, seq: int) -> None:
        """:class:`NotFound` unless the session holds an event at ``seq``
        (read as in :meth:`_require_session`)."""
        try:  # one page: the first event after seq - 1 is the one wanted, if any
            first: SessionView = await self._query(
                "session.get", None, consistency="any", user=user, session=session, events=True, after_seq=seq - 1
            )
        except NotFound as exc:
            raise NotFound(f"{exc.message}: nothing forgotten") from None
        if not first.events or first.events[0].seq != seq:
            raise NotFound(f"session {session!r} of user {user!r} holds no event at seq {seq}: nothing forgotten")

    async def delete_user(self, user: str, *, missing_ok: bool = False) -> int:
        """Delete a user of this app, with all their sessions and ``user:``
        state, everywhere; return the delete's sequence.

        :param missing_ok: as in :meth:`delete_session`: by default a user
            with neither a session nor ``user:`` state raises
            :class:`~memq.contracts.errors.NotFound` and nothing is published.
        """
        message = self._build(UserDeleted, user=user)
        if not missing_ok:
            await self._require_user(user)
        return await self._publish(message)

    async def _require_session(self, user: str, session: str, outcome: str) -> None:
        """:class:`NotFound` unless the session exists, as the query service
        sees it with ``consistency="any"``: after every write that any client
        had acknowledged in the user's scope (a creation, an append, a delete)
        is committed. A write acknowledged after this read began (another
        writer's delete, say) is not seen: the caller's publish may still
        land on a session deleted meanwhile (an append then starts it again,
        as with ``create=True``; ``expect_seq`` closes that window)."""
        try:
            await self._query("session.get", None, consistency="any", user=user, session=session, events=False)
        except NotFound as exc:
            raise NotFound(f"{exc.message}: {outcome}") from None

    async def _require_user(self, user: str) -> None:
        """:class:`NotFound` unless the user has a session or ``user:`` state
        (both read as in :meth:`_require_session`)."""
        sessions, state = await asyncio.gather(
            self.list_sessions(user, limit=1, consistency="any"), self.get_state(user, consistency="any")
        )
        if not sessions.sessions and not any(k.startswith(USER_PREFIX) for k in state):
            raise NotFound(f"no user {user!r} in app {self.app!r} (no session, no user: state): nothing deleted")

    # --- reads (the query service) ----------------------------------------------
    #
    # Every read takes ``min_seq``: the service answers once that stream sequence
    # is committed. Default ``None`` means this client's :attr:`last_seq` (unless
    # the client was made with ``consistent=False``); ``0`` means do not wait.
    # And ``consistency``: ``"any"`` also waits for every other writer's
    # acknowledged writes in the read's scope. Default: the client's (``"own"``).

    async def get_session(
        self,
        user: str,
        session: str,
        *,
        events: bool = False,
        num_recent_events: int | None = None,
        after_seq: int | None = None,
        after: After = None,
        roles: Sequence[Role] = (),
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> SessionView:
        """A session with its merged state (``app:`` and ``user:`` keys prefixed,
        as ADK shows them). Raises :class:`~memq.contracts.errors.NotFound`.

        :param events: include the events. Default False; implied by the
            filters below.
        :param num_recent_events: only the last N events (of those the other
            filters keep). Default: all.
        :param after_seq: only events after this sequence. Default: all.
        :param after: only events whose ``timestamp`` is later than this: unix
            seconds, a :class:`~datetime.datetime` (naive = local time), or a
            :class:`~datetime.timedelta` meaning "within the last …"
            (``timedelta(hours=24)``). Default: any time.
        :param roles: only events with these message roles (``"user"``,
            ``"assistant"``, ``"system"``, ``"tool"``). Default: all.
        :param min_seq: see the note above. Default: :attr:`last_seq`.

        Every event the filters keep comes back, however many: the service
        answers in pages that fit NATS's ``max_payload`` and this method
        joins them (:meth:`iter_events` yields them page by page instead).
        """
        events = events or num_recent_events is not None or after_seq is not None or after is not None or bool(roles)
        fields: dict[str, Any] = dict(
            user=user, session=session, events=events, num_recent_events=num_recent_events, after_seq=after_seq
        )
        fields.update(event_filters(after, roles))
        held, seeding = self._held("session.get", min_seq, consistency, fields)
        if held is not None:
            return held
        read_at = seeding[2] if seeding is not None else min_seq
        pages = self._pages("session.get", read_at, consistency=consistency, **fields)
        first: SessionView = await anext(pages)
        rest = [e for page in [p async for p in pages] for e in page.events or ()]
        view = first.model_copy(update={"events": [*(first.events or ()), *rest], "next_cursor": None})
        self._seed("session.get", seeding, view)
        return view

    def _held(
        self, op: str, min_seq: int | None, consistency: Consistency | None, fields: dict[str, Any]
    ) -> tuple[Any, tuple[BaseModel, Any, int] | None]:
        """A read's answer from :attr:`local_reads`, or None and, when its
        reply may seed a window, (the request, the ticket, the ``min_seq`` to
        read with: explicit, so that the read waits for the commit rather
        than carry writes, and the reply is exact)."""
        local = self.local_reads
        if local is None:
            return None, None
        request = build_request(
            self.app, op, min_seq=min_seq or None, consistency=consistency or self.consistency, **fields
        )
        if min_seq is None and request.consistency != "any" and (found := local.answer(op, request)) is not None:
            return found, None
        ticket = local.seeds(op, request)
        if ticket is None:
            return None, None
        return None, (request, ticket, self._min_seq(op, min_seq) or 0)

    def _seed(self, op: str, seeding: tuple[BaseModel, Any, int] | None, reply: Any) -> None:
        if seeding is not None and self.local_reads is not None:
            request, ticket, read_at = seeding
            self.local_reads.seed(op, request, reply, read_at, ticket)

    async def iter_events(
        self,
        user: str,
        session: str,
        *,
        after_seq: int | None = None,
        after: After = None,
        roles: Sequence[Role] = (),
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> AsyncIterator[StoredEvent]:
        """A session's events, oldest first, fetched a page at a time (each
        page as large as NATS's ``max_payload`` allows): for a session too
        large to hold in memory at once. The filters are those of
        :meth:`get_session`. Events appended while it runs are not yielded:
        the read ends at the newest event its first page saw."""
        async for page in self._pages(
            "session.get",
            min_seq,
            consistency=consistency,
            user=user,
            session=session,
            events=True,
            after_seq=after_seq,
            **event_filters(after, roles),
        ):
            for event in page.events or ():
                yield event

    async def list_sessions(
        self,
        user: str | None = None,
        *,
        limit: int = 50,
        cursor: str | None = None,
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> SessionsPage:
        """One page of sessions, most recently updated first.

        :param user: only this user's sessions. Default: every user of the app.
        :param limit: page size, 1..500. Default 50.
        :param cursor: ``next_cursor`` of the previous page. Default: the first page.
        :param min_seq: see the note above. Default: :attr:`last_seq`.
        """
        return await self._query(
            "sessions.list", min_seq, consistency=consistency, user=user, limit=limit, cursor=cursor
        )

    async def iter_sessions(
        self,
        user: str | None = None,
        page_size: int = 100,
        *,
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> AsyncIterator[SessionInfo]:
        """Every session (of ``user``, default all users), most recently updated
        first, fetched ``page_size`` (default 100) at a time by following cursors.
        ``min_seq`` and ``consistency`` apply to the first page (the cursor bounds the rest)."""
        cursor = None
        while True:
            page = await self.list_sessions(
                user, limit=page_size, cursor=cursor, min_seq=min_seq, consistency=consistency
            )
            consistency = "own"
            min_seq = None
            for info in page.sessions:
                yield info
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def get_state(
        self,
        user: str,
        session: str | None = None,
        *,
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> dict[str, Any]:
        """The merged state a session sees, or without ``session`` (the default)
        the user's and the app's state (``user:`` and ``app:`` keys)."""
        view: StateView = await self._query("state.get", min_seq, consistency=consistency, user=user, session=session)
        return view.state

    async def history(
        self,
        user: str,
        session: str,
        *,
        strategy: Strategy = None,
        model: str | None = None,
        after: After = None,
        roles: Sequence[Role] = (),
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> HistoryView:
        """A session's events through a working-memory strategy, with token counts.

        :param strategy: a :class:`~memq.contracts.queries.StrategySpec` or a dict of
            its fields (``{"kind": "token_window", "budget": 4000}``). Unset
            fields take the app's settings. Default: the app's strategy.
        :param model: count tokens as this model does. Default: the app's model.
        :param after: only events later than this, as in :meth:`get_session`.
            Default: any time.
        :param roles: only events with these message roles. Default: all.
        :param min_seq: see the note above. Default: :attr:`last_seq`.

        Filters come first, the strategy second: the window is taken from the
        events the filters keep (for ``summary_buffer``, those after the latest
        checkpoint; its summary is returned as usual). A role filter is exact:
        ``roles=["assistant"]`` can keep a tool call without its ``tool``
        result; ask for both roles to keep tool units whole. ``needs_summary``
        is only reported without filters.

        Every event the strategy keeps comes back (``all``: the whole
        session), over as many pages as it takes.
        """
        fields: dict[str, Any] = dict(user=user, session=session, strategy=strategy, model=model)
        fields.update(event_filters(after, roles))
        held, seeding = self._held("history", min_seq, consistency, fields)
        if held is not None:
            return held
        pages = self._pages(
            "history", seeding[2] if seeding is not None else min_seq, consistency=consistency, **fields
        )
        first: HistoryView = await anext(pages)
        rest = [e for page in [p async for p in pages] for e in page.events]
        view = first.model_copy(update={"events": [*first.events, *rest], "next_cursor": None})
        self._seed("history", seeding, view)
        return view

    async def context(
        self,
        user: str,
        session: str,
        *,
        strategy: Strategy = None,
        model: str | None = None,
        format: ContextFormat = "memq",
        instruction: str | None = None,
        recall_limit: int = 20,
        facts_limit: int = 0,
        message: str | None = None,
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> ContextView:
        """What to send to the model: recalled memories, the latest summary and
        the recent window within the budget, with the token count of each part.
        The view's ``budget``, ``over_budget`` and ``note`` say, in every
        format, whether it fits: it does unless the strategy is ``all``
        (``none``) or ``buffer_window``, or the instruction alone does not
        fit. A summary too long for the budget is cut to its newest part
        (``note`` says so).

        :param strategy: as in :meth:`history`. Default: the app's strategy
            (``summary_buffer``, budget 8000, unless configured).
        :param model: as in :meth:`history`. Default: the app's model.
        :param format: ``"memq"`` (default) or ``"openai"`` (chat messages).
        :param instruction: a system instruction template rendered from state:
            ``{key}``, ``{user:key}``, ``{key?}`` (empty if unset; without ``?``
            an unset key raises :class:`~memq.contracts.errors.TemplateKeyMissing`).
            One that would render longer than the service's
            ``query.max_instruction_chars`` or than one reply carries is
            refused at once as :class:`~memq.contracts.errors.Oversize`.
            Default: none.
        :param recall_limit: long-term memories to recall, at most, 0..100;
            ``summary_buffer``'s ``recall_share`` bounds their tokens. Default 20.
        :param facts_limit: facts about the user (the fact worker's), at most,
            0..100, in a part of their own ("What is known about the user")
            before the recalled memories: those that relate to the last user
            message first, then the newest. They never take the room of the
            newest messages, and such a context is never cached (facts change
            after a commit). Default 0: none.
        :param message: a user message not stored yet (about to be sent):
            placed last, counted in the budget and used for recall. Default none.
        :param min_seq: see the note above. Default: :attr:`last_seq`.

        A context of any size comes back whole (e.g. strategy ``all`` on a
        long session): the service answers in pages and this method joins
        their messages (and, in memq's format, ``context["window"]``).
        """
        fields: dict[str, Any] = dict(
            user=user,
            session=session,
            strategy=strategy,
            model=model,
            format=format,
            instruction=instruction,
            recall_limit=recall_limit,
            facts_limit=facts_limit,
            message=message,
        )
        held, seeding = self._held("context", min_seq, consistency, fields)
        if held is not None:
            return held
        asked = fields
        if seeding is not None and self.local_reads is not None:
            # a held window grows from this format's reply; the caller gets its own
            asked = {**fields, "format": self.local_reads.seed_format("context") or format}
        pages = self._pages("context", seeding[2] if seeding is not None else min_seq, consistency=consistency, **asked)
        first: ContextView = await anext(pages)
        messages, window = list(first.messages), list((first.context or {}).get("window", ()))
        async for page in pages:
            messages += page.messages
            window += (page.context or {}).get("window", ())
        update: dict[str, Any] = {"messages": messages, "next_cursor": None}
        if first.context is not None:
            update["context"] = {**first.context, "window": window}
        view = first.model_copy(update=update)
        self._seed("context", seeding, view)
        if view.format != format:  # every format carries the messages; memq's adds its own form
            view = view.model_copy(update={"format": format, "context": None})
        return view

    async def list_artifacts(
        self, user: str, session: str, *, min_seq: int | None = None, consistency: Consistency | None = None
    ) -> ArtifactsView:
        """The artifacts of a session, with their number of versions."""
        return await self._query("artifacts.list", min_seq, consistency=consistency, user=user, session=session)

    async def get_artifact(
        self,
        user: str,
        session: str,
        filename: str,
        version: int | None = None,
        *,
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> bytes:
        """The content of an artifact, checked against its SHA-256. Large
        artifacts are read from the object store.

        :param version: 0-based version. Default: the latest.
        """
        view: ArtifactView = await self._query(
            "artifacts.get",
            min_seq,
            consistency=consistency,
            user=user,
            session=session,
            filename=filename,
            version=version,
        )
        data = view.inline if view.object is None else await self._get_object(view.object["name"])
        if data is None:
            raise MemqError(f"artifact {filename!r} v{view.version}: the reply has neither content nor object")
        digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        if digest != view.sha256 or len(data) != view.size:
            raise MemqError(f"artifact {filename!r} v{view.version} is corrupt: size or sha256 does not match")
        return data

    async def search(
        self,
        user: str,
        query: str,
        *,
        session: str | None = None,
        mode: SearchMode = "hybrid",
        k: int = 10,
        authors: Sequence[str] = (),
        roles: Sequence[SearchRole] = (),
        since: float | None = None,
        until: float | None = None,
        alpha: float | None = None,
        min_seq: int | None = None,
        consistency: Consistency | None = None,
    ) -> SearchResults:
        """Search the user's long-term memory (all their sessions, or one).
        Results are best first, with Hector's SearchResult fields.

        :param mode: ``"keyword"`` (BM25), ``"vector"`` or ``"hybrid"`` (default).
        :param k: results, 1..100. Default 10.
        :param authors: keep only these authors (default: all).
        :param roles: keep only these roles (default: all).
        :param since: timestamp range ``[since, until)``: from (default: open).
        :param until: to, excluded (default: open).
        :param alpha: hybrid weight of the vector side. Default: the server's (0.5).
        :param min_seq: answer once this sequence is *indexed* (the index
            trails commits by the time embedding takes). Default:
            :attr:`last_seq`, as every read (unless the client was made with
            ``consistent=False``), so a search finds this client's own
            writes: it waits for their indexing, at most ``wait_ms``, then
            fails with :class:`~memq.contracts.errors.NotCommitted` (the
            index is down, or no indexing worker runs). ``min_seq=0``: do not
            wait, search what is indexed now (faster, may miss the newest).
        """
        if min_seq is None and self.consistent:  # read-your-writes here too (_min_seq leaves search out)
            min_seq = self.last_seq
        return await self._query(
            "search",
            min_seq,
            consistency=consistency,
            user=user,
            query=query,
            session=session,
            mode=mode,
            k=k,
            authors=list(authors),
            roles=list(roles),
            since=since,
            until=until,
            alpha=alpha,
        )

    async def facts(
        self,
        user: str,
        query: str | None = None,
        *,
        mode: SearchMode = "hybrid",
        include_invalid: bool = False,
        limit: int = 20,
        min_seq: int | None = None,
    ) -> FactsView:
        """Facts about the user that the fact worker derived from their turns
        (facts must be on: ``facts.llm`` set on the workers). Without ``query``,
        the current facts, oldest first; with one, those that relate to it,
        best first (each with its ``score``), ranked as :meth:`search` ranks
        memories: ``mode`` ``hybrid`` (default), ``keyword`` or ``vector``,
        with the search's relevance floor; the reply's ``mode`` says which answered.

        :param include_invalid: also the facts a later one contradicted
            (their ``invalid_from`` and ``invalidated_by`` say when and which).
        :param limit: facts, 1..100. Default 20.
        :param min_seq: wait until facts are derived up to this sequence
            (e.g. :attr:`last_seq`), at most ``wait_ms``; the reply's
            ``behind`` is the number of the user's sessions still not derived
            when it answered. Default: no wait (facts are derived by an LLM,
            seconds behind the turns): ``behind`` then counts every session
            with turns not derived yet.
        """
        return await self._query(
            "facts",
            min_seq or 0,
            user=user,
            query=query,
            mode=mode,
            include_invalid=include_invalid,
            limit=limit,
        )

    async def profile(self, user: str, *, min_seq: int | None = None) -> ProfileView:
        """The user's current facts grouped by the entities they name (see :meth:`facts`)."""
        return await self._query("facts.profile", min_seq or 0, user=user)

    async def fact_history(self, user: str, fact_id: str) -> FactHistoryView:
        """Every revision of one fact about the user, oldest first: added,
        merged, invalidated... (:class:`~memq.contracts.errors.NotFound` for a
        fact that is not this user's)."""
        return await self._query("facts.history", 0, user=user, fact_id=fact_id)

    async def watch_status(self, user: str, session: str) -> AsyncIterator[dict[str, Any]]:
        """Yield what workers announce about a session as it happens, e.g.
        ``{"state": "summarizing", "up_to_seq": 120}`` then ``"summarized"``
        (or ``"failed"``), to show "Summarizing conversation history…" as
        Hector does. Stop by breaking out of the loop."""
        sub = await self.nc.subscribe(status_subject(self.app, user, session))
        try:
            async for msg in sub.messages:
                yield orjson.loads(msg.data)
        finally:
            await sub.unsubscribe()

    def with_history(
        self,
        model_fn: ModelFn,
        *,
        user: str,
        session: str,
        strategy: Strategy = None,
        format: ContextFormat = "openai",
        instruction: str | None = None,
        recall_limit: int = 20,
    ) -> Callable[[str], Awaitable[str]]:
        """Wrap a model call with this session's memory (after LangChain's
        ``RunnableWithMessageHistory``). ``await chat(text)``:

        1. appends ``text`` as a user event;
        2. loads :meth:`context` (``format`` default ``"openai"``,
           ``recall_limit`` default 20), waiting for that event to be
           committed, so the context ends with it;
        3. calls ``model_fn(messages)`` (sync or async; it returns a ``str`` or
           an object with ``.content``, like a chat completion message);
        4. appends the reply as an assistant event and returns its text.

        With ``recall_limit=0`` (and no ``instruction``) on a client made with
        ``local_reads``, step 2 is answered in the client: a turn costs its two
        publishes and no request.
        """

        async def chat(text: str) -> str:
            seq = await self.append_text(user, session, "user", text)
            ctx = await self.context(
                user,
                session,
                strategy=strategy,
                format=format,
                instruction=instruction,
                recall_limit=recall_limit,
                # the default (this client's last write) may carry it; an explicit one waits
                min_seq=None if self.consistent else seq,
            )
            reply = model_fn(ctx.messages)
            if inspect.isawaitable(reply):
                reply = await reply
            answer = reply if isinstance(reply, str) else reply.content
            await self.append_text(user, session, "assistant", answer)
            return answer

        return chat

    async def page(self, op: str, *, min_seq: int | None = None, **fields: Any) -> Any:
        """One reply of query ``op`` (a key of ``OPS`` in :mod:`memq.contracts.queries`)
        as the service sends it, typed: for a paged op (``session.get``,
        ``history``, ``context``) one page, whose ``next_cursor`` asks for the
        next (``cursor=``). For callers that relay pages rather than join
        them (the HTTP gateway); the named methods above are the usual way.

        :param fields: the op's request fields (``user``, ``session``, …).
        :param min_seq: as in every read. Default: :attr:`last_seq`.
        """
        return await self._query(op, min_seq, **fields)

    async def _pages(self, op: str, min_seq: int | None, **fields: Any) -> AsyncIterator[Any]:
        """Every page of a paged read (see :mod:`memq.contracts.queries`):
        the same request again with each reply's ``next_cursor``, until none."""
        # Only a read of the client's own writes may carry them: an explicit
        # min_seq promises every write up to it, whoever wrote it.
        carry = min_seq is None
        # Resolved once (0: no wait), so a write made while paging does not hold later pages back.
        min_seq = self._min_seq(op, min_seq) or 0
        cursor = None
        while True:
            page = await self._query(op, min_seq, cursor=cursor, carry=carry, **fields)
            carry = False
            yield page
            if page.next_cursor is None:
                return
            cursor = page.next_cursor
            # The first page waited for what it had to; the cursor bounds the rest.
            fields["consistency"] = "own"

    def _min_seq(self, op: str, min_seq: int | None) -> int | None:
        # Read-your-writes by default, where min_seq waits for commits: a
        # search's waits for the index, which trails commits (see search()).
        if min_seq is None and self.consistent and OPS[op].waits_for == "persistence":
            return self.last_seq
        return min_seq

    async def _query(
        self,
        op: str,
        min_seq: int | None,
        *,
        consistency: Consistency | None = None,
        carry: bool = False,
        **fields: Any,
    ) -> Any:
        self._on_its_loop()
        min_seq = self._min_seq(op, min_seq)
        if (consistency or self.consistency) == "any":  # "own" is sent as before: older services know no field
            fields["consistency"] = "any"
        elif carry and self._recent is not None and min_seq and op in CARRIES and fields.get("cursor") is None:
            room = self._payload_limit() // 4
            fields["carried"] = self._recent.carried(fields["user"], fields["session"], min_seq, max_bytes=room)
        request = build_request(self.app, op, min_seq=min_seq or None, wait_ms=self.wait_ms, **fields)
        body = encode_request(request)
        if len(body) > self._payload_limit() and "carried" in fields:  # a long message= besides: the read waits
            request = request.model_copy(update={"carried": None})
            body = encode_request(request)
        subject = request_subject(self.app, op)
        timeout = self.timeout + request.wait_ms / 1000
        try:
            msg = await self.nc.request(subject, body, timeout=timeout)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            if denied := self._denied(subject):
                raise Forbidden(f"request to {subject} refused by NATS: {denied}") from None
            late = f" within {timeout:g}s" if isinstance(exc, nats.errors.TimeoutError) else ""
            raise Unavailable(
                f"no query service is answering{late} on {subject}: is `memq up` or `memq worker query` running?"
            ) from None
        except nats.errors.Error as exc:  # connection closed or draining
            raise Unavailable(f"request to {subject} failed: {type(exc).__name__}: {exc}") from exc
        reply = parse_reply(op, msg.data)
        if self._recent is not None and op in CARRIES and (known := reply.committed_seq or min_seq):
            # Committed up to there: the reply says so, or the read waited for it.
            self._recent.committed(fields["user"], fields["session"], known)
        return reply

    async def _get_object(self, name: str) -> bytes:
        buffer = io.BytesIO()
        try:
            if self._objects is None:
                self._objects = await self._js.object_store(ARTIFACT_BUCKET)
            # writeinto: plain get() grows one bytes object chunk by chunk (quadratic).
            await self._objects.get(name, writeinto=buffer)
        except nats.js.errors.NotFoundError:  # no bucket, no object, or a deleted one
            raise NotFound(f"artifact object {name!r} is not in the object store {ARTIFACT_BUCKET}") from None
        except (nats.errors.Error, TimeoutError) as exc:
            if denied := self._denied("$"):
                raise Forbidden(
                    f"reading artifact object {name!r} refused by NATS ({denied}): this app's NATS user "
                    "may not use the object store"
                ) from None
            raise Unavailable(f"reading artifact object {name!r} failed: {type(exc).__name__}: {exc}") from exc
        return buffer.getvalue()

    # --- building and publishing ----------------------------------------------

    def _build(self, cls: type, **fields: Any) -> Any:
        # Ids first, so that callers get InvalidId rather than InvalidMessage.
        validate_id(fields["user"], "user")
        if "session" in fields:
            validate_id(fields["session"], "session")
        try:
            return cls(app=self.app, **fields)
        except ValidationError as exc:
            raise InvalidMessage(f"invalid {cls.__name__}: {validation_details(exc)}") from None

    def _payload_limit(self) -> int:
        return min(self.max_message_bytes, self.nc.max_payload - HEADER_ROOM)

    def _prepare(self, message: Any) -> Prepared:
        data = encode(message)
        limit = self._payload_limit()
        if len(data) > limit:
            raise Oversize(f"{message.kind} message is {len(data)} bytes; the limit is {limit}")
        return subject_for(message), data, {"Nats-Msg-Id": msg_id(message, data)}

    def _prepare_events(self, user: str, session: str, events: Sequence[Event]) -> list[Prepared]:
        """``_prepare(_build(EventAppended, …))`` of every event, with the
        envelope (ids, subject, its JSON) checked and encoded once per call,
        not per event: an :class:`Event` was validated when it was made, and
        EventAppended takes it as it is. Anything else (a dict) is built in full."""
        if not events:
            return []
        first = self._build(EventAppended, user=user, session=session, event=events[0])
        subject, encode_event, limit = subject_for(first), event_encoder(first), self._payload_limit()
        prepared: list[Prepared] = []
        for event in events:
            if type(event) is not Event:
                prepared.append(self._prepare(self._build(EventAppended, user=user, session=session, event=event)))
                continue
            data = encode_event(event)
            if len(data) > limit:
                raise Oversize(f"event message is {len(data)} bytes; the limit is {limit}")
            prepared.append((subject, data, {"Nats-Msg-Id": dedupe_id(subject, event.id, data)}))
        return prepared

    async def _publish(self, message: Any, expect_seq: int | None = None, *, local: bool = True) -> int:
        """Publish one message; ``local``: tell :attr:`local_reads` of it
        (what it may change is dropped), else the caller does."""
        prepared = self._prepare(message)
        if not local or self.local_reads is None:
            seq = await self._send(expecting(prepared, expect_seq))
        else:
            try:
                seq = await self._send(expecting(prepared, expect_seq))
            except BaseException:
                self.local_reads.wrote(message)
                raise
            self.local_reads.wrote(message, seq)
        if self._recent is not None:
            event = message.event if isinstance(message, EventAppended) else None
            session = getattr(message, "session", None)
            self._recent.wrote(message.user, session, seq, message.kind, event, len(prepared[1]))
        return seq

    async def _send(self, prepared: Prepared) -> int:
        self._on_its_loop()
        return (await self._settle([prepared]))[0]

    async def _publish_chunk(self, chunk: list[Prepared]) -> list[int]:
        self._on_its_loop()
        return await self._settle(chunk)

    async def _put_object(self, name: str, data: bytes) -> None:
        try:
            if self._objects is None:
                self._objects = await self._js.object_store(ARTIFACT_BUCKET)
            await self._objects.put(name, data)
        except nats.js.errors.BucketNotFoundError:
            raise PublishFailed(
                f"object store bucket {ARTIFACT_BUCKET} not found: run `memq init` or start a worker"
            ) from None
        except (nats.errors.Error, TimeoutError) as exc:
            if denied := self._denied("$"):
                raise PublishFailed(
                    f"storing artifact object {name!r} refused by NATS ({denied}): this app's NATS user may "
                    f"not use the object store; keep artifacts under inline_artifact_limit ({self.inline_artifact_limit} bytes)"
                ) from None
            raise PublishFailed(f"storing artifact object {name!r} failed: {type(exc).__name__}: {exc}") from exc

    def _denied(self, subject: str) -> str | None:
        """The server's permissions violation for ``subject`` (or a subject
        starting with it), if that is why nothing came back: nats-py reports
        it only to ``error_cb`` and leaves the request to time out."""
        error = str(self.nc.last_error or "")
        found = error.lower()  # nats-py lower-cases the whole message, subject included
        if "permissions violation" not in found:
            return None
        if f'publish to "{subject.lower()}' in found:
            return error.removeprefix("nats: ")
        inbox = self.nc.new_inbox().rsplit(".", 1)[0]
        if f'subscription to "{inbox.lower()}.' in found:  # no reply can reach this connection
            return (
                f"{error.removeprefix('nats: ')}: this connection's user may not receive on {inbox}.> "
                f"(a publish may still have been stored); connect with inbox_prefix={app_inbox_prefix(self.app)!r}"
            )
        return None
