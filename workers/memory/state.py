"""State scopes, after ADK: no prefix = session, ``user:`` = every session of
the user in the app, ``app:`` = the whole app, ``temp:`` = never persisted
(the contract's state delta drops those keys when validated:
:func:`memq.contracts.schemas.persisted_state`; the skips here hold for a
delta built without validation).

Deleting a key (``StateSet.delete``) is a write like a set, of the value
:data:`DELETED`: it takes part in stream order the same way (the highest
``seq`` wins), so a later set creates the key again and an earlier set that
commits late cannot bring it back. SQL keeps the deleted key as a tombstone
row (value :data:`TOMBSTONE`, with the delete's ``seq``) that reads skip.
``None`` in a delta stays a value (JSON ``null``), as it always was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memq.contracts.schemas import TEMP_PREFIX

APP_PREFIX = "app:"
USER_PREFIX = "user:"


class _Deleted:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()
"""The value of a deleted key in a delta (never a JSON value)."""
TOMBSTONE = ""
"""The stored value of a deleted key: JSON text is never empty."""


def with_deletes(delta: Mapping[str, Any], deleted: Iterable[str] = ()) -> dict[str, Any]:
    """One delta that sets ``delta`` and deletes ``deleted`` (a
    :class:`~memq.contracts.schemas.StateSet` checks that they do not overlap)."""
    return {**delta, **dict.fromkeys(deleted, DELETED)}


@dataclass
class ScopedDelta:
    """A delta split by scope, prefixes stripped, ``temp:`` keys dropped."""

    app: dict[str, Any] = field(default_factory=dict)
    user: dict[str, Any] = field(default_factory=dict)
    session: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.app or self.user or self.session)


def split_delta(delta: Mapping[str, Any]) -> ScopedDelta:
    out = ScopedDelta()
    for key, value in delta.items():
        if key.startswith(TEMP_PREFIX):
            continue
        if key.startswith(APP_PREFIX):
            out.app[key[len(APP_PREFIX) :]] = value
        elif key.startswith(USER_PREFIX):
            out.user[key[len(USER_PREFIX) :]] = value
        else:
            out.session[key] = value
    return out


def merge_state(app: Mapping[str, Any], user: Mapping[str, Any], session: Mapping[str, Any]) -> dict[str, Any]:
    """The state a session shows, as ADK shows it: scoped keys re-prefixed."""
    merged = dict(session)
    merged.update({USER_PREFIX + k: v for k, v in user.items()})
    merged.update({APP_PREFIX + k: v for k, v in app.items()})
    return merged


def apply_in_order(deltas: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Reference semantics: the state after applying deltas one by one in
    stream order (what the persistence worker must end up with, whatever the
    number of replicas)."""
    state: dict[str, Any] = {}
    for delta in deltas:
        for key, value in delta.items():
            if key.startswith(TEMP_PREFIX):
                continue
            if value is DELETED:
                state.pop(key, None)
            else:
                state[key] = value
    return state
