"""Notices: what workers tell each other and clients on core NATS (in no
stream, so a notice that finds no listener is gone, and nothing waits on it).

- :class:`CommitNotice` on ``memq.v1.changed.<app>.<user>[.<session>]``
  (:func:`memq.contracts.subjects.changed_subject`): the persistence worker
  committed something of this session or user. Caches drop what it touched;
  the summarizer looks whether a summary is due.
- :class:`StatusEvent` on ``memq.v1.status.<app>.<user>.<session>``
  (:func:`memq.contracts.subjects.status_subject`): what a worker is doing
  to a session while it does it (the summarizer: ``summarizing``, then
  ``summarized`` or ``failed``).

- :class:`CommittedRanges` on ``memq.v1.committed.<durable>``
  (:func:`memq.contracts.subjects.committed_subject`): the stream sequences a
  persistence replica has finished with (committed, or dead-lettered) in one
  batch, after their acks. Query workers move their commit floor on it
  instead of polling the consumer (read-your-writes).

All are JSON objects. Readers ignore fields they do not know, so a newer
writer can add some.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field


class CommitNotice(BaseModel):
    """Sent after every commit: one per session touched or deleted, one per
    user whose user state (or whose app's state) changed or who was deleted."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    app: str
    user: str
    session: str | None = Field(default=None, description="absent: the notice is about the user as a whole")
    seq: int | None = Field(default=None, description="the stream sequence committed (absent: state changes only)")
    deleted: bool = Field(default=False, description="the session (or, without a session, the user) was deleted")
    app_state: bool = Field(default=False, description="the app's state changed")
    user_state: bool = Field(default=False, description="the user's state changed")

    def wire(self) -> dict:
        """The wire form: ``session``/``seq`` only when set, ``deleted`` only when true."""
        body: dict = {"app": self.app, "user": self.user, "app_state": self.app_state, "user_state": self.user_state}
        if self.session is not None:
            body["session"] = self.session
        if self.seq is not None:
            body["seq"] = self.seq
        if self.deleted:
            body["deleted"] = True
        return body

    def encode(self) -> bytes:
        return orjson.dumps(self.wire())


SummaryState = Literal["summarizing", "summarized", "failed"]


class StatusEvent(BaseModel):
    """What a worker is doing to one session, as it happens."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    app: str
    user: str
    session: str
    state: SummaryState
    up_to_seq: int | None = Field(default=None, description="the summary covers the session up to this sequence")

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(exclude_none=True))


class CommittedRanges(BaseModel):
    """Sent by a persistence replica after each batch, once its acks are out:
    every stream sequence it finished with in the batch (committed to SQL,
    or dead-lettered), as inclusive runs. Other replicas finish other
    sequences in any order; a reader joins the runs into a contiguous floor."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ranges: list[tuple[int, int]] = Field(description="inclusive [first, last] runs of stream sequences, ascending")
    changed: list[CommitNotice] = Field(
        default_factory=list,
        description="the batch's commit notices (as on memq.v1.changed.>): a reader drops what they made stale "
        "before it moves its floor, so a read woken by this notice is never cached and then dropped",
    )

    @classmethod
    def of(cls, seqs: Iterable[int], changed: Iterable[CommitNotice] = ()) -> CommittedRanges:
        """Compress sequences (any order, repeats allowed) into runs."""
        ranges: list[tuple[int, int]] = []
        for seq in sorted(set(seqs)):
            if ranges and ranges[-1][1] + 1 == seq:
                ranges[-1] = (ranges[-1][0], seq)
            else:
                ranges.append((seq, seq))
        return cls(ranges=ranges, changed=list(changed))

    def encode(self) -> bytes:
        return orjson.dumps({"ranges": self.ranges, "changed": [n.wire() for n in self.changed]})
