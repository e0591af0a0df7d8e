"""A client's own recent writes, carried with its reads (``queries.Carried``).

An agent's turn is an append, then a read that must hold it. Waiting for
the commit puts the whole persistence path (fetch, commit, ack, notice)
inside every turn, though the client already holds what it just wrote. So
a history or context read carries the client's writes to that session that
may not be committed yet, and the query service answers from SQL at its
commit floor plus those (``memq.workers.query.carried``), or waits as before
whenever that would not be exact.

What makes it exact is a promise the client keeps: every message it
published to the session after ``after`` is in ``writes``. Older writes
are dropped when the caps push them out (``after`` moves up past them), and
whole sessions are forgotten least recently written first (a forgotten
session carries nothing, with ``after`` at the newest sequence ever
forgotten). The service answers without waiting only if its floor has
reached ``after``.

A write is kept until a reply says it is committed (its ``committed_seq``,
or the ``min_seq`` a read waited for), not for a fixed time: the commit
floor is one for the whole stream, so behind another app's backlog of huge
events a commit takes seconds, not milliseconds, and a write dropped after
a second made the read wait for that backlog after all. The caps
bound what is kept and carried instead: ``MAX_CARRIED`` writes and
``MAX_BYTES`` per session (a write larger than that is never kept: it could
not be carried, so ``after`` passes it at once). Dropping one too early is
safe: ``after`` passes it, and the read waits for its commit instead.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from memq.contracts.queries import MAX_CARRIED

MAX_BYTES = 64 * 1024  # kept and carried per session; beyond, the older writes wait for their commit
MAX_KEYS = 4096  # sessions (and users) remembered


@dataclass
class _Writes:
    after: int = 0
    # (seq, kind, event, size), oldest first
    writes: deque[tuple[int, str, Any, int]] = field(default_factory=deque)
    size: int = 0  # of the writes kept

    def add(self, seq: int, kind: str, event: Any, size: int, max_bytes: int) -> None:
        if size > max_bytes:  # never carried whole: the read waits for its commit
            self.forget(seq)
            return
        self.writes.append((seq, kind, event, size))
        self.size += size
        while len(self.writes) > MAX_CARRIED or self.size > max_bytes:
            self._drop_oldest()

    def forget(self, upto: int) -> None:
        while self.writes and self.writes[0][0] <= upto:
            self._drop_oldest()
        self.after = max(self.after, upto)

    def _drop_oldest(self) -> None:
        seq, _, _, size = self.writes.popleft()
        self.size -= size
        self.after = max(self.after, seq)


class RecentWrites:
    """Per session, this client's writes (sequence, kind, event, size) that
    no reply has said are committed yet, within the caps."""

    def __init__(self, max_keys: int = MAX_KEYS, max_bytes: int = MAX_BYTES):
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self._sessions: OrderedDict[tuple[str, str], _Writes] = OrderedDict()
        self._users: OrderedDict[str, int] = OrderedDict()  # newest seq on the user's own subject
        self._forgotten = 0  # newest seq of any session or user forgotten

    def wrote(self, user: str, session: str | None, seq: int, kind: str, event: Any = None, size: int = 0) -> None:
        """Record a publish the stream acknowledged at ``seq``."""
        if session is None:
            self._users[user] = max(seq, self._users.pop(user, 0))
            if len(self._users) > self.max_keys:
                self._forgotten = max(self._forgotten, self._users.popitem(last=False)[1])
            return
        key = (user, session)
        writes = self._sessions.pop(key, None) or _Writes(after=self._forgotten)
        writes.add(seq, kind, event, size, self.max_bytes)
        self._sessions[key] = writes
        if len(self._sessions) > self.max_keys:
            _, dropped = self._sessions.popitem(last=False)
            self._forgotten = max(self._forgotten, dropped.after, *(w[0] for w in dropped.writes))

    def committed(self, user: str, session: str, upto: int) -> None:
        """Every write up to ``upto`` is committed (a reply said so): forget them."""
        if (record := self._sessions.get((user, session))) is not None:
            record.forget(upto)

    def carried(self, user: str, session: str, upto: int, max_bytes: int | None = None) -> dict[str, Any]:
        """The ``carried`` field of a read of the session whose ``min_seq``
        is ``upto``: the newest writes up to it that fit ``max_bytes``
        (default: the one given at construction, or less)."""
        record = self._sessions.get((user, session))
        after = record.after if record is not None else self._forgotten
        writes: list[dict[str, Any]] = []
        room = self.max_bytes if max_bytes is None else min(max_bytes, self.max_bytes)
        for seq, kind, event, size in reversed(record.writes if record is not None else ()):
            if seq > upto:
                continue
            if size > room:  # this one and older wait for their commit
                after = max(after, seq)
                break
            room -= size
            writes.append(
                {"seq": seq, "kind": kind, "event": event} if event is not None else {"seq": seq, "kind": kind}
            )
        writes.reverse()
        return {"after": after, "writes": writes, "user_seq": self._users.get(user, self._forgotten)}
