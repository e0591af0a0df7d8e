"""The REST routes of the HTTP gateway (FastAPI), in the shape of ADK's and
Hector's session endpoints: ``/v1/apps/{app}/users/{user}/sessions/{session}``
with its ``events``, ``history``, ``context`` and ``state``, plus ``search``.

Each route is one :class:`~memq.contracts.client.MemoryClient` call of the
app the path names, after its API key is checked (:mod:`.keys`): reads are
requests to the query service, writes are publishes to the event log, so
the gateway adds HTTP and nothing else. Paged reads (a session's events,
history, context) answer one page of the query service's and its
``next_cursor``; ask again with ``cursor=`` for the next. Writes answer
``202`` with the stream sequence; a read given ``min_seq=`` that sequence
sees the write (read-your-writes, as every memq read).

Sessions that do not exist: an append starts one (``"create": false`` in
the body refuses it with 404 instead); a delete answers 404 and deletes
nothing. ``DELETE`` on ``events/{seq}`` forgets one event everywhere, as a
session's delete does a session (404 if the session holds no event at
``seq``). On the user's state path an unprefixed key means ``user:<key>``.

Every error is ``{"error": {"code", "message"}}``: 401 (no or unknown key),
403 (another app's key, or refused by NATS), 404, 409 (``min_seq`` not
committed in time), 413, 422 (bad input), 503 (no query service, NATS
away), 500.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from memq.contracts.client import MemoryClient
from memq.workers.http import error_responses
from memq.workers.http.door import DEFAULT_LIMITS, BodyLimits, FrontDoor
from memq.workers.http.keys import Keyring
from memq.workers.http.paths import RawSegments
from memq.workers.http.routes import ROUTERS
from memq.workers.http.routes.common import Wiring, wire
from memq.workers.redact import Redactor
from memq.workers.settings import HttpSettings

API_VERSION = "1"
SHAPES_ONLY = Redactor()  # URLs, paths and addresses, without the settings' own values


def build_api(
    keyring: Keyring,
    client_for: Callable[[str], MemoryClient],
    *,
    limits: BodyLimits = DEFAULT_LIMITS,
    redact: Callable[[str], str] = SHAPES_ONLY,
    key_inflight: int = HttpSettings().key_inflight,
) -> FastAPI:
    """The gateway's FastAPI app: ``client_for(app)`` gives the client of an
    app whose key was checked (see :mod:`.clients`), behind the
    :class:`~.door.FrontDoor` that checks the key before the body is read
    and the body against ``limits`` as it is, at most ``key_inflight``
    requests of one key at once. ``redact`` scrubs the message of every memq error
    answered (:mod:`memq.workers.redact`; default: of URLs, paths and
    addresses, without knowing the gateway's settings). The routes are the
    module-level routers of :mod:`.routes`; what they use of the gateway is
    the app's state (:class:`~.routes.common.Wiring`)."""
    api = FastAPI(
        title="memq HTTP gateway",
        version=API_VERSION,
        summary="Sessions, events, history, context, search and state of memq over HTTP",
        description=(__doc__ or "").split("\n\n", 1)[1],
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
        responses=error_responses.DOCUMENTED,
    )
    wire(api, Wiring(keyring=keyring, client_for=client_for, redact=redact))
    documents = (api.openapi_url, api.docs_url, api.swagger_ui_oauth2_redirect_url)
    api.add_middleware(
        FrontDoor, keyring=keyring, limits=limits, public=[p for p in documents if p], key_inflight=key_inflight
    )
    api.add_middleware(RawSegments)  # added last: outermost, so the door sees the segments as sent
    error_responses.install(api)
    for router in ROUTERS:
        api.include_router(router)
    return api
