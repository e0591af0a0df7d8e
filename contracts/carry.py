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
are dropped as they age out (``after`` moves up past them), and whole
sessions are forgotten least recently written first (a forgotten session
carries nothing, with ``after`` at the newest sequence ever forgotten). The
service answers without waiting only if its floor has reached ``after``.

A write is carried for ``max_age_s`` (1 s) at most: by then it is committed
(a commit takes milliseconds), and carrying every write of a long session
would cost each read more than the wait it saves. Dropping one too early
is safe: ``after`` passes it, and the read waits for its commit instead.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memq.contracts.queries import MAX_CARRIED

MAX_BYTES = 64 * 1024  # carried per read; beyond, the older writes wait for their commit
MAX_KEYS = 4096  # sessions (and users) remembered
MAX_AGE_S = 1.0  # a write carried longer than this is surely committed


@dataclass
class _Writes:
    after: int = 0
    # (seq, kind, event, size, time.monotonic() when acknowledged)
    writes: deque[tuple[int, str, Any, int, float]] = field(default_factory=lambda: deque(maxlen=MAX_CARRIED))

    def add(self, seq: int, kind: str, event: Any, size: int, at: float) -> None:
        if len(self.writes) == self.writes.maxlen:
            self.after = max(self.after, self.writes[0][0])
        self.writes.append((seq, kind, event, size, at))

    def forget(self, upto: int) -> None:
        while self.writes and self.writes[0][0] <= upto:
            self.writes.popleft()
        self.after = max(self.after, upto)

    def age_out(self, before: float) -> None:
        while self.writes and self.writes[0][4] < before:
            self.after = max(self.after, self.writes.popleft()[0])


class RecentWrites:
    """Per session, this client's last writes (sequence, kind, event, size)."""

    def __init__(
        self,
        max_keys: int = MAX_KEYS,
        max_bytes: int = MAX_BYTES,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.clock = clock
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
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
        writes.add(seq, kind, event, size, self.clock())
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
        if record is not None:
            record.age_out(self.clock() - self.max_age_s)
        after = record.after if record is not None else self._forgotten
        writes: list[dict[str, Any]] = []
        room = self.max_bytes if max_bytes is None else min(max_bytes, self.max_bytes)
        for seq, kind, event, size, _ in reversed(record.writes if record is not None else ()):
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
