"""What the gateway's routers share: the app's client as a dependency, the
path and query parameters several routes take, and the JSON answer.

The client comes from the app's state (:func:`wire`, set by
:func:`~memq.workers.http.api.build_api`), not from a closure, so each
router is a module-level :class:`~fastapi.APIRouter`.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at run time.
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel

from memq.contracts.client import MemoryClient
from memq.contracts.queries import ContextGet, SessionsList, StrategyName, StrategySpec
from memq.contracts.schemas import Timestamp
from memq.contracts.vocabulary import Role
from memq.workers.http.door import API_KEY_HEADER, BEARER
from memq.workers.http.keys import Keyring
from memq.workers.http.params import query
from memq.workers.http.paths import ID

# {x:id}: one path segment, "/" and "%" in it sent escaped (paths.py: any id is reachable)
APP_PATH = f"/v1/apps/{{app:{ID}}}"
BASE = APP_PATH + f"/users/{{user:{ID}}}"
SESSION_PATH = BASE + f"/sessions/{{session:{ID}}}"


@dataclass(frozen=True)
class Wiring:
    """What the routes use of the gateway: its keys, the client of an app whose
    key was checked, and how an error's message is scrubbed."""

    keyring: Keyring
    client_for: Callable[[str], MemoryClient]
    redact: Callable[[str], str]


def wire(api: FastAPI, wiring: Wiring) -> None:
    api.state.memq = wiring


def wiring(request: Request) -> Wiring:
    found: Wiring = request.app.state.memq
    return found


App = Annotated[str, Path(description="the app id (the API key must be this app's)")]
User = Annotated[str, Path(description="the user id")]
Session = Annotated[str, Path(description="the session id")]


def client(
    request: Request,
    app: App,
    token: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    key: Annotated[str | None, Depends(API_KEY_HEADER)],
) -> MemoryClient:
    # The door has refused a bad key already, before the body was read;
    # checked again here so that no route depends on the door being there.
    gate = wiring(request)
    gate.keyring.authorize(app, token.credentials if token is not None else key)
    return gate.client_for(app)


Client = Annotated[MemoryClient, Depends(client)]

MinSeq = Annotated[
    int | None,
    query(ContextGet, "min_seq", "answer once this stream sequence (a write's `seq`) is committed: read-your-writes"),
]
Cursor = Annotated[str | None, query(ContextGet, "cursor", "`next_cursor` of the previous page")]
After = Annotated[Timestamp | None, Query(description="only events whose timestamp is later (unix seconds)")]
Roles = Annotated[list[Role], Query(description="only events with these message roles (repeat the parameter)")]
StrategyKind = Annotated[StrategyName | None, Query(description="working-memory strategy; default: the app's")]
Budget = Annotated[int | None, query(StrategySpec, "budget", "token budget; default: the app's")]
Window = Annotated[int | None, query(StrategySpec, "window", "buffer_window: last N messages")]
Turns = Annotated[int | None, query(StrategySpec, "turns", "buffer_window: last N user turns")]
Model = Annotated[str | None, query(ContextGet, "model", "count tokens as this model; default: the app's")]
Limit = Annotated[int, query(SessionsList, "limit", "sessions per page")]


def strategy_spec(kind: str | None, budget: int | None, window: int | None, turns: int | None) -> dict | None:
    """The strategy spec of the flat parameters given, or None (the app's)."""
    spec = {
        k: v for k, v in (("kind", kind), ("budget", budget), ("window", window), ("turns", turns)) if v is not None
    }
    return spec or None


def as_json(model: BaseModel, status: int = 200) -> Response:
    # Serialized once, as the model says; FastAPI would validate it again first.
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")
