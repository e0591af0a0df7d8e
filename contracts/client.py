"""The async client an agent uses to write into memq (DESIGN §1, §5).

Every write is one message on ``MEMQ_EVENTS``. A method returns once JetStream
has acknowledged it, with its stream sequence: the message's position in the
session and the token a read-your-writes query waits for. Each message carries
``Nats-Msg-Id`` (the event or message id), so a retried publish inside the
stream's duplicate window gets the original sequence back instead of a copy.

Bad input fails before any I/O: :class:`~contracts.errors.InvalidId`,
:class:`~contracts.errors.InvalidMessage` or :class:`~contracts.errors.Oversize`.
NATS failures become :class:`~contracts.errors.PublishFailed`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.object_store import ObjectStore
from pydantic import ValidationError

from contracts.codec import DEFAULT_MAX_BYTES, encode, subject_for
from contracts.errors import InvalidMessage, MemqError, Oversize, PublishFailed
from contracts.ids import validate_id
from contracts.schemas import (
    ArtifactSaved,
    Event,
    EventAppended,
    Message,
    ObjectRef,
    SessionCreated,
    SessionDeleted,
    StateSet,
    TextPart,
    UserDeleted,
    new_id,
)
from contracts.subjects import ARTIFACT_BUCKET, EVENTS_STREAM, artifact_object_name

MAX_IN_FLIGHT = 1000  # unacknowledged publishes per append_many chunk
# The server counts headers in max_payload and drops the connection of a client
# that exceeds it; ours (message id, expected stream) stay well below this.
HEADER_ROOM = 1024
EXPECTED_STREAM_MISMATCH = 10060  # JetStream err_code: the subject is in another stream
Role = Literal["user", "assistant", "system", "tool"]
_Prepared = tuple[str, bytes, dict[str, str]]  # subject, payload, headers


@dataclass(frozen=True, slots=True)
class SessionRef:
    """A session and the stream sequence of the message that created it."""

    app: str
    user: str
    session: str
    seq: int


class MemoryClient:
    """Publishes session events, state, artifacts and deletes for one app.

    :param nc: a connected nats-py client; the caller keeps ownership of it
        (use :meth:`connect` for a client that owns its connection).
    :param app: the app id; every message is published under it.
    :param timeout: seconds to wait for a PubAck (per chunk in
        :meth:`append_many`). Default 5.0.
    :param inline_artifact_limit: artifacts up to this many bytes travel inline
        in the message; larger ones go to the object store. Default 256 KiB.
    :param max_message_bytes: encoded messages above this size raise
        :class:`Oversize` before publishing. Default 1 MiB (the workers'
        limit), capped by the server's ``max_payload`` minus ``HEADER_ROOM``.
    :param stream: the stream expected to capture the events. Default
        ``MEMQ_EVENTS``.
    """

    def __init__(
        self,
        nc: Client,
        app: str,
        *,
        timeout: float = 5.0,
        inline_artifact_limit: int = 256 * 1024,
        max_message_bytes: int = DEFAULT_MAX_BYTES,
        stream: str = EVENTS_STREAM,
    ):
        self.app = validate_id(app, "app")
        self.nc = nc
        self.timeout = timeout
        self.inline_artifact_limit = inline_artifact_limit
        self.max_message_bytes = max_message_bytes
        self.stream = stream
        self._js = nc.jetstream(timeout=timeout)
        self._objects: ObjectStore | None = None
        self._owns_connection = False

    @classmethod
    async def connect(
        cls,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        *,
        app: str,
        timeout: float = 5.0,
        inline_artifact_limit: int = 256 * 1024,
        max_message_bytes: int = DEFAULT_MAX_BYTES,
        stream: str = EVENTS_STREAM,
        **nats_options: Any,
    ) -> MemoryClient:
        """Connect to NATS and return a client that closes the connection on
        :meth:`close`. ``nats_options`` go to :func:`nats.connect` (auth, TLS,
        reconnects); the other parameters are those of the constructor."""
        validate_id(app, "app")  # fail before opening a connection
        nats_options.setdefault("name", f"memq-client:{app}")
        nc = await nats.connect(servers, **nats_options)
        client = cls(
            nc,
            app,
            timeout=timeout,
            inline_artifact_limit=inline_artifact_limit,
            max_message_bytes=max_message_bytes,
            stream=stream,
        )
        client._owns_connection = True
        return client

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

    async def append(self, user: str, session: str, event: Event) -> int:
        """Append one event to a session; return its stream sequence."""
        return await self._publish(self._build(EventAppended, user=user, session=session, event=event))

    async def append_text(self, user: str, session: str, role: Role, text: str, author: str | None = None) -> int:
        """Append a one-part text message.

        :param role: ``user``, ``assistant``, ``system`` or ``tool``.
        :param author: default ``"user"`` for the user role, else the app id.
        """
        author = author if author is not None else ("user" if role == "user" else self.app)
        event = Event(author=author, message=Message(role=role, parts=[TextPart(text=text)]))
        return await self.append(user, session, event)

    async def append_many(self, user: str, session: str, events: Sequence[Event]) -> list[int]:
        """Append events in order; return their sequences in input order.

        Every event is validated and encoded before the first publish, so bad
        input publishes nothing. Publishes are pipelined, at most
        ``MAX_IN_FLIGHT`` unacknowledged at a time. If a chunk fails, earlier
        chunks stay published; retrying the whole call is safe (dedupe by id).
        """
        prepared = [self._prepare(self._build(EventAppended, user=user, session=session, event=e)) for e in events]
        if not prepared:
            return []
        # The first is awaited alone: nats-py drops JetStream errors of
        # publish_async (nats.py#985, they surface only as a timeout), so a
        # missing or wrong stream fails here, fast and with its real reason.
        seqs = [await self._send(prepared[0])]
        for start in range(1, len(prepared), MAX_IN_FLIGHT):
            seqs += await self._publish_chunk(prepared[start : start + MAX_IN_FLIGHT])
        return seqs

    async def set_state(self, user: str, delta: dict, session: str | None = None) -> int:
        """Apply a state delta outside any event.

        :param session: default ``None``: then only ``user:``, ``app:`` and
            ``temp:`` keys are allowed.
        """
        scope = {} if session is None else {"session": session}
        return await self._publish(self._build(StateSet, user=user, delta=delta, **scope))

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
        prepared = self._prepare(self._build(ArtifactSaved, object=ref, **fields))
        await self._put_object(name, data)
        return await self._send(prepared)

    async def delete_session(self, user: str, session: str) -> int:
        """Delete a session everywhere (SQL, index, cache, stream, artifacts)."""
        return await self._publish(self._build(SessionDeleted, user=user, session=session))

    async def delete_user(self, user: str) -> int:
        """Delete a user of this app, with all their sessions, everywhere."""
        return await self._publish(self._build(UserDeleted, user=user))

    # --- building and publishing ----------------------------------------------

    def _build(self, cls: type, **fields: Any) -> Any:
        # Ids first, so that callers get InvalidId rather than InvalidMessage.
        validate_id(fields["user"], "user")
        if "session" in fields:
            validate_id(fields["session"], "session")
        try:
            return cls(app=self.app, **fields)
        except ValidationError as exc:
            details = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:3])
            raise InvalidMessage(f"invalid {cls.__name__}: {details}") from None

    def _prepare(self, message: Any) -> _Prepared:
        data = encode(message)
        limit = min(self.max_message_bytes, self.nc.max_payload - HEADER_ROOM)
        if len(data) > limit:
            raise Oversize(f"{message.kind} message is {len(data)} bytes; the limit is {limit}")
        return subject_for(message), data, {"Nats-Msg-Id": message.msg_id}

    async def _publish(self, message: Any) -> int:
        return await self._send(self._prepare(message))

    async def _send(self, prepared: _Prepared) -> int:
        subject, data, headers = prepared
        try:
            ack = await self._js.publish(subject, data, timeout=self.timeout, stream=self.stream, headers=headers)
        except (nats.errors.Error, TimeoutError) as exc:
            raise self._failed(exc, subject) from exc
        return ack.seq

    async def _publish_chunk(self, chunk: list[_Prepared]) -> list[int]:
        # One session per call, so every message of the chunk has one subject.
        futures: list[asyncio.Future] = []
        try:
            for subject, data, headers in chunk:
                futures.append(await self._js.publish_async(subject, data, stream=self.stream, headers=headers))
            # publish_async futures have no timeout of their own.
            acks = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), self.timeout)
        except (nats.errors.Error, TimeoutError) as exc:
            for future in futures:  # frees their slots in nats-py's pending limit
                future.cancel()
            raise self._failed(exc, chunk[0][0]) from exc
        for ack in acks:
            if isinstance(ack, BaseException):
                raise self._failed(ack, chunk[0][0]) from ack
        return [ack.seq for ack in acks]

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
            raise PublishFailed(f"storing artifact object {name!r} failed: {type(exc).__name__}: {exc}") from exc

    def _failed(self, exc: BaseException, subject: str) -> MemqError:
        if isinstance(exc, nats.errors.MaxPayloadError):
            return Oversize(f"publish to {subject} refused: larger than the server's max_payload")
        if isinstance(exc, nats.js.errors.NoStreamResponseError):
            why = f"stream {self.stream} not found: run `memq init` or start a worker"
        elif isinstance(exc, nats.js.errors.APIError) and exc.err_code == EXPECTED_STREAM_MISMATCH:
            why = f"the subject is not captured by stream {self.stream} ({exc.description})"
        elif isinstance(exc, TimeoutError):
            why = f"no acknowledgement from JetStream within {self.timeout}s"
        else:
            why = f"{type(exc).__name__}: {exc}"
        return PublishFailed(f"publish to {subject} failed: {why}")
