"""Sessions and their events: list, create, get, delete; list and append events."""

# No `from __future__ import annotations`: FastAPI reads the annotations at run time.
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from memq.contracts.client import event_filters
from memq.contracts.queries import SessionGet, SessionsPage, SessionView
from memq.workers.http.models import Accepted, Appended, EventsPage, NewEvents, NewSession, SessionCreated
from memq.workers.http.params import query
from memq.workers.http.routes.common import (
    APP_PATH,
    BASE,
    SESSION_PATH,
    After,
    Client,
    Cursor,
    Limit,
    MinSeq,
    Roles,
    Session,
    User,
    as_json,
)

sessions = APIRouter(tags=["sessions"])
events = APIRouter(tags=["events"])


@sessions.get(APP_PATH + "/sessions", response_model=SessionsPage)
async def list_app_sessions(
    client: Client,
    user: Annotated[str | None, Query(description="only this user's sessions")] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    min_seq: MinSeq = None,
) -> Response:
    """A page of the app's sessions (of every user, or one), most recently updated first."""
    return as_json(await client.list_sessions(user, limit=limit, cursor=cursor, min_seq=min_seq))


@sessions.get(BASE + "/sessions", response_model=SessionsPage)
async def list_sessions(
    client: Client,
    user: User,
    limit: Limit = 50,
    cursor: Cursor = None,
    min_seq: MinSeq = None,
) -> Response:
    """A page of a user's sessions, most recently updated first; `next_cursor` asks for the next."""
    return as_json(await client.list_sessions(user, limit=limit, cursor=cursor, min_seq=min_seq))


@sessions.post(BASE + "/sessions", response_model=SessionCreated, status_code=201)
async def create_session(client: Client, user: User, body: NewSession) -> Response:
    """Create a session (stored once the persistence worker commits `seq`)."""
    ref = await client.create_session(user, body.id, body.state)
    return as_json(SessionCreated(app=ref.app, user=ref.user, session=ref.session, seq=ref.seq), 201)


@sessions.get(SESSION_PATH, response_model=SessionView)
async def get_session(
    client: Client,
    user: User,
    session: Session,
    events: Annotated[bool, Query(description="include the events (one page of them)")] = False,
    num_recent_events: Annotated[int | None, query(SessionGet, "num_recent_events")] = None,
    after_seq: Annotated[int | None, query(SessionGet, "after_seq")] = None,
    after: After = None,
    roles: Roles = [],  # noqa: B006 - FastAPI copies a parameter's default per request
    cursor: Cursor = None,
    min_seq: MinSeq = None,
) -> Response:
    """A session with its merged state; with `events`, one page of its events (`next_cursor`)."""
    wants_events = events or num_recent_events is not None or after_seq is not None or after is not None or roles
    view = await client.page(
        "session.get",
        min_seq=min_seq,
        user=user,
        session=session,
        events=bool(wants_events),
        num_recent_events=num_recent_events,
        after_seq=after_seq,
        cursor=cursor,
        **event_filters(after, roles),
    )
    return as_json(view)


@sessions.delete(SESSION_PATH, response_model=Accepted, status_code=202)
async def delete_session(client: Client, user: User, session: Session) -> Response:
    """Delete a session everywhere (SQL, index, cache, stream, artifacts), in stream order;
    404 if it does not exist (never created, or deleted already)."""
    return as_json(Accepted(seq=await client.delete_session(user, session)), 202)


@events.get(SESSION_PATH + "/events", response_model=EventsPage)
async def list_events(
    client: Client,
    user: User,
    session: Session,
    after_seq: Annotated[int | None, query(SessionGet, "after_seq", "only events after this sequence")] = None,
    after: After = None,
    roles: Roles = [],  # noqa: B006
    cursor: Cursor = None,
    min_seq: MinSeq = None,
) -> Response:
    """One page of a session's events, oldest first; `next_cursor` asks for the next."""
    view = await client.page(
        "session.get",
        min_seq=min_seq,
        user=user,
        session=session,
        events=True,
        after_seq=after_seq,
        cursor=cursor,
        **event_filters(after, roles),
    )
    return as_json(EventsPage(events=view.events or [], next_cursor=view.next_cursor))


@events.post(SESSION_PATH + "/events", response_model=Appended, status_code=202)
async def append_events(client: Client, user: User, session: Session, body: NewEvents) -> Response:
    """Append events in order; each is in the log once JetStream has stored it. An append
    to a session that does not exist starts it, unless `create` is false (then 404)."""
    seqs = await client.append_many(user, session, body.events, expect_seq=body.expect_seq, create=body.create)
    return as_json(Appended(seq=max(seqs), seqs=seqs), 202)


@events.delete(SESSION_PATH + "/events/{seq}", response_model=Accepted, status_code=202)
async def forget_event(
    client: Client,
    user: User,
    session: Session,
    seq: Annotated[
        int, Path(ge=1, description="the event's stream sequence (a stored event's or a search hit's `seq`)")
    ],
    expect_seq: Annotated[
        int | None,
        Query(ge=0, description="forget only while the session's last sequence is still this one, else 409 `conflict`"),
    ] = None,
) -> Response:
    """Forget one event of a session everywhere (SQL, index, cache, stream), in stream order;
    404 if the session holds no event at `seq` (never did, or forgotten already). A summary
    that already folded the event keeps it."""
    return as_json(Accepted(seq=await client.forget_event(user, session, seq, expect_seq=expect_seq)), 202)
