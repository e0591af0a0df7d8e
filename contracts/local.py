"""Reads answered in the client: a turn that costs one publish.

An agent's turn is an append, then a read that must hold it. The client
already holds what it wrote; if it also holds the session as of stream
sequence ``n`` (the reply of its last read), an append published with
``expect_seq=n`` that JetStream acknowledges proves that nothing else was
written to the session's subject between ``n`` and the new event. The held
session plus the new event is then the session as of the acknowledgement,
and the next read of it is answered here, with no request. A
:class:`~memq.contracts.errors.Conflict` means another writer got there
first: the window is dropped, the append is published again without the
check (the caller asked for none), and the next read asks the query service.

Why a local answer is never stale:

- Everything that changes a session's events, checkpoint, session state,
  artifacts or existence is a message on the session's own subject
  (``memq.v1.ev.<app>.<user>.<session>``): appends, the creation, state sets
  with a session, artifacts, the summarizer's checkpoints, forgets, deletes,
  and the expiry sweep's delete (it publishes the same ``SessionDeleted``).
  Each moves the subject's last sequence, so the next conditional append is
  refused. Purges never move it back below a message the window has not
  seen: a session delete purges below itself and stays, a forget deletes an
  older event and stays, and a subject purged empty (a user delete, stream
  limits) has last sequence 0, which no window's ``n`` is.
- The held reply is exact as of ``n``: a ``session.get`` reply seeds at its
  ``last_seq`` (the session's newest message of any kind) only when that is
  at or below the ``min_seq`` the read waited for, so every message up to it
  was committed and visible (the commit floor is contiguous; a cached reply
  is only served when it was read at a floor at or above ``min_seq``). A
  history reply carries no ``last_seq``: it seeds at this client's own
  newest write to the session, when the read waited for that commit (a
  reply that carried writes above its floor never seeds). A dead-lettered
  message on the subject touches no row: the window's ``n`` is then below
  the subject's last and the next append is refused, never wrong.
- What the worker answers is recomputed with the worker's own pure logic
  (``memq.workers.memory``): the new event's stored JSON and token count,
  the strategies' cuts. Where that cannot be exact from what is held (a
  tool result whose call the window does not hold, a strategy's summary
  trigger that depends on events the reply left out), that read asks the
  service.
- This client's own other writes invalidate what they change: any other
  write to the session (state, artifact, forget, delete, ``append_many``),
  a write to the user's subject (``user:``/``app:`` state, a user delete),
  an event elsewhere whose state delta has ``user:`` or ``app:`` keys, and
  any publish whose outcome is unknown or acknowledged as a duplicate.

What is served locally, and only for reads with the client's default
consistency (``"own"``) and no explicit ``min_seq``:

- ``get_session`` without filters (``after``, ``roles``, ``after_seq``): the
  session with its merged state, and no events, its newest
  ``num_recent_events``, or all of them while the window holds all;
- ``history`` without filters and without ``model`` (the deployment's
  counting model must be the default; the first reply is checked against it);
- ``context`` in OpenAI's format that is assembly over the window alone:
  ``recall_limit=0``, no ``instruction``, no ``facts_limit``, no pending
  ``message``, no ``model`` (the turn an agent sends its model). The first
  read asks the service in memq's format, whose window entries carry the
  seqs and counts a held context grows from, and hands the caller the
  OpenAI form of that reply. A summary the reply shows cut to fit is not
  cut again here: the next append's read asks the service.

Not served locally, and why:

- ``consistency="any"``: such a read must see every write acknowledged
  before it began, and a local answer is as of this client's last
  acknowledgement, not of the read. (Two agent processes on one session
  keep their correctness through ``expect_seq`` regardless: the next append
  of the one that read an older session is refused.)
- any other ``context``: recall needs the index (the client cannot know
  whether the service recalls, nor what), an instruction needs state, facts
  are the fact worker's; memq's own format reports the summarizer's trigger
  (``needs_summary``), which depends on the whole window.
- ``search``, listings, artifacts, state reads: other subjects, the index.

One limit of ``"own"`` remains, bounded: writes by *other* clients to the
user's own subject (``user:`` and ``app:`` state, a user delete) are not on
the session's subject, so ``expect_seq`` cannot see them. ``"own"`` never
promised them (a carried read does not show those above its floor either),
but the held session is refreshed from the service after ``max_age``
seconds so that they are seen within that time.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel

from memq.contracts.schemas import Event


class LocalReads(Protocol):
    """What :class:`~memq.contracts.client.MemoryClient` asks of the session
    windows it holds (``memq.workers.memory.local.LocalWindows`` is the one
    implementation: it needs the workers' token counting and strategies)."""

    def bind(self, app: str) -> None:
        """Called by the client it is given to: windows are keyed by user and
        session, so one instance serves one app's client."""
        ...

    def expect(self, user: str, session: str) -> int | None:
        """The ``expect_seq`` of the next append to the session: the sequence
        its held window is as of, or None when none is held."""
        ...

    def appended(self, user: str, session: str, expect_seq: int | None, seq: int, event: Event) -> None:
        """An append published with ``expect_seq`` was acknowledged at ``seq``
        (not as a duplicate): extend the window when ``expect_seq`` is the
        sequence it is as of, else drop it."""
        ...

    def wrote(self, message: Any, seq: int | None = None) -> None:
        """Any other publish of this client (acknowledged, refused or of
        unknown outcome): drop what it may change."""
        ...

    def forget(self, user: str, session: str) -> None:
        """Drop the session's window."""
        ...

    def answer(self, op: str, request: BaseModel) -> Any | None:
        """The whole reply of ``request`` (a validated ``session.get`` or
        ``history`` request), joined as the client returns it, or None when
        it must be asked of the service."""
        ...

    def seeds(self, op: str, request: BaseModel) -> Any | None:
        """A ticket when a reply to this read may seed a window (then the
        client reads without carrying its writes, so that the reply is
        exact), taken before the read is sent; None when it may not."""
        ...

    def seed_format(self, op: str) -> str | None:
        """The reply format a seeding read of ``op`` asks the service for
        instead of the caller's (the client hands the caller its own), or None
        to ask as the caller does."""
        ...

    def seed(self, op: str, request: BaseModel, reply: Any, min_seq: int, ticket: Any) -> None:
        """The joined reply of a read that waited for ``min_seq`` to be
        committed (0: it did not wait), with the ticket :meth:`seeds` gave."""
        ...
