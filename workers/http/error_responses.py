"""How the gateway answers errors: every one as ``{"error": {"code", "message"}}``
(:func:`~.door.error_response`), its status the one its class says
(:mod:`memq.contracts.errors`), its message scrubbed (the app's
:class:`~.routes.common.Wiring` ``redact``)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from memq.contracts.errors import InvalidRequest, MemqError
from memq.workers.http.door import error_response, unauthenticated, wrong_app
from memq.workers.http.keys import Unauthenticated, WrongApp
from memq.workers.http.models import ErrorBody
from memq.workers.http.routes.common import wiring

log = logging.getLogger("memq.http")

# The statuses the routes answer with: each error class says its own (contracts/errors.py).
DOCUMENTED: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (401, "no API key, or an unknown one"),
        (403, "the key is another app's, or NATS refused the app's request"),
        (404, "no such session, or no event at that sequence"),
        (409, "min_seq was not committed in time (retry), or expect_seq is not the last one"),
        (413, "body over http.max_body_bytes, JSON over http.max_json_elements or _depth, or an event too large"),
        (422, "bad input: the message says which field"),
        (
            429,
            "the app holds its share of the query service's slots or waiting reads, or its key has http.key_inflight requests in flight on the gateway: retry",
        ),
        (503, "the query service or NATS is unavailable: retry"),
    )
}


async def memq_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, MemqError)
    # A query worker's message is scrubbed already; the gateway's own client errors (NATS) are not.
    message = wiring(request).redact(exc.message)
    if message != exc.message:
        log.warning("an error named server details, which the answer leaves out: %s", exc.message)
    return error_response(exc.http_status, exc.code, message, {"Retry-After": "1"} if exc.retry_later else None)


async def on_unauthenticated(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Unauthenticated)
    return unauthenticated(exc)


async def on_wrong_app(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WrongApp)
    return wrong_app(exc)


async def invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3]
    )  # loc: ("query", "limit"), ("body", "events", 0, …)
    return error_response(422, InvalidRequest.code, problems or "invalid request")


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        # FastAPI answers a body it cannot decode with a bare 400 ("There was an
        # error parsing the body"); the docs promise 422 naming what is wrong.
        bad = exc.__cause__
        return error_response(
            422,
            InvalidRequest.code,
            f"body: not UTF-8 ({bad.reason} at byte {bad.start}): send JSON encoded as UTF-8",
        )
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
    return error_response(exc.status_code, code, str(exc.detail), dict(exc.headers or {}))


def install(api: FastAPI) -> None:
    """Answer each kind of error as the module doc says."""
    api.add_exception_handler(MemqError, memq_error)
    api.add_exception_handler(Unauthenticated, on_unauthenticated)
    api.add_exception_handler(WrongApp, on_wrong_app)
    api.add_exception_handler(RequestValidationError, invalid)
    api.add_exception_handler(StarletteHTTPException, http_error)
