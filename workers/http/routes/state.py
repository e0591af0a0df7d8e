"""State: the user's and the app's (`user:`, `app:` keys), and a session's merged state."""

# No `from __future__ import annotations`: FastAPI reads the annotations at run time.
from fastapi import APIRouter, Response

from memq.contracts.client import MemoryClient
from memq.contracts.errors import InvalidRequest
from memq.contracts.queries import StateView
from memq.contracts.schemas import user_scoped, user_scoped_delta
from memq.workers.http.models import Accepted, StateChange
from memq.workers.http.routes.common import BASE, SESSION_PATH, Client, MinSeq, Session, User, as_json

state = APIRouter(tags=["state"])


async def _change_state(client: MemoryClient, user: str, session: str | None, body: StateChange) -> Response:
    if not body.set and not body.delete:
        raise InvalidRequest("nothing to change: give `set`, `delete` or both")
    changes, deletes = body.set, body.delete
    if session is None:  # the user's path: an unprefixed key is the user's own
        try:
            changes = user_scoped_delta(changes)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        deletes = [user_scoped(k) for k in deletes]
    if both := sorted(set(changes) & set(deletes)):
        raise InvalidRequest(f"keys both set and deleted: {both}")
    seq = 0
    if deletes:  # deletes and sets apply in stream order; no key is in both
        seq = await client.delete_state(user, deletes, session=session)
    if changes:
        seq = await client.set_state(user, changes, session=session)
    return as_json(Accepted(seq=seq), 202)


@state.get(BASE + "/state", response_model=StateView)
async def user_state(client: Client, user: User, min_seq: MinSeq = None) -> Response:
    """The user's and the app's state (`user:` and `app:` keys)."""
    return as_json(StateView(state=await client.get_state(user, min_seq=min_seq)))


@state.patch(BASE + "/state", response_model=Accepted, status_code=202)
async def change_user_state(client: Client, user: User, body: StateChange) -> Response:
    """Set and delete the user's state outside any session: an unprefixed key means
    `user:<key>` (reads show it so); `app:` and `temp:` keys are taken as they are."""
    return await _change_state(client, user, None, body)


@state.get(SESSION_PATH + "/state", response_model=StateView)
async def session_state(client: Client, user: User, session: Session, min_seq: MinSeq = None) -> Response:
    """The merged state a session sees (its keys, then `user:` and `app:` keys)."""
    return as_json(StateView(state=await client.get_state(user, session, min_seq=min_seq)))


@state.patch(SESSION_PATH + "/state", response_model=Accepted, status_code=202)
async def change_session_state(client: Client, user: User, session: Session, body: StateChange) -> Response:
    """Set and delete a session's state keys (prefixed keys reach the user's or the app's state)."""
    return await _change_state(client, user, session, body)
