"""Typed errors shared by the client and the workers.

Every error has a stable ``code`` so that replies over the wire and dead-letter
entries can name the reason without Python tracebacks.
"""

from __future__ import annotations


class MemqError(Exception):
    """Base of every memq error. ``code`` is stable and machine-readable.

    No error is also a ``ValueError``: the id types raise :class:`InvalidId`
    in pydantic validators, which would turn a ``ValueError`` into a
    ``ValidationError`` (a decoded message's bad id would become
    ``invalid_message``, a model's a ``ValidationError``).

    ``http_status`` is what the HTTP gateway answers with it, and
    ``retry_later`` whether the same request may succeed later (the gateway
    then sends ``Retry-After``): said here, with the code, so that a new
    error cannot become a 500 by being left out of a second table.
    """

    code = "error"
    http_status = 500
    retry_later = False

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class InvalidId(MemqError):
    """An app, user, session or other id is empty, too long or not UTF-8."""

    code = "invalid_id"
    http_status = 422


class InvalidMessage(MemqError):
    """The payload is not JSON, not an object, or fails schema validation."""

    code = "invalid_message"
    http_status = 422


class UnsupportedVersion(MemqError):
    """The payload names a schema version this build does not understand."""

    code = "unsupported_version"
    http_status = 422


class Oversize(MemqError):
    """The payload is larger than the configured limit."""

    code = "oversize"
    http_status = 413


class SubjectMismatch(MemqError):
    """The payload names other ids than the subject it was published on."""

    code = "subject_mismatch"
    http_status = 422


class PublishFailed(MemqError):
    """JetStream did not acknowledge a publish."""

    code = "publish_failed"
    http_status = 503
    retry_later = True


class QuotaExceeded(PublishFailed):
    """The app's own stream is full: its quota is reached (a deployment that
    gives each app a stream, ``streams.apps``). Other apps are not affected;
    the write was not stored."""

    code = "quota_exceeded"
    http_status = 507  # Insufficient Storage: retrying will not help until space is freed
    retry_later = False


class PublishOutcomeUnknown(PublishFailed):
    """A publish was tried until its deadline and never acknowledged, and at
    least one try may have been stored (its ack was lost). Publishing the
    same message again (the same event, so the same id) is safe: JetStream's
    dedupe and the database keep it once. A new event with the same content
    may store it twice.

    ``subject`` is where it was published; ``msg_id`` the ``Nats-Msg-Id`` of
    the first message not acknowledged, ``msg_ids`` those of all of them (an
    ``append_many`` may leave several)."""

    code = "publish_outcome_unknown"
    http_status = 503
    retry_later = False  # only with the same event ids (see above)

    def __init__(self, message: str, subject: str = "", msg_ids: tuple[str, ...] = ()):
        super().__init__(message)
        self.subject = subject
        self.msg_ids = msg_ids
        self.msg_id = msg_ids[0] if msg_ids else ""


class Conflict(MemqError):
    """A write made with ``expect_seq`` was refused: another writer appended
    to the session first (JetStream's ``Nats-Expected-Last-Subject-Sequence``
    check). Reload the session and decide again.

    ``last_seq`` is the stream sequence of the session's last message as the
    server reported it (``0``: none, e.g. the session was deleted and purged;
    ``None`` when the reason did not say).
    """

    code = "conflict"
    http_status = 409  # reload, then write again: no Retry-After

    def __init__(self, message: str, last_seq: int | None = None):
        super().__init__(message)
        self.last_seq = last_seq


class NotFound(MemqError):
    code = "not_found"
    http_status = 404


class Forbidden(MemqError):
    """A request names another app than the subject it was sent on."""

    code = "forbidden"
    http_status = 403


class NotCommitted(MemqError):
    """A request's ``min_seq`` was not committed within its ``wait_ms``."""

    code = "not_committed"
    http_status = 409
    retry_later = True


class InvalidRequest(MemqError):
    code = "invalid_request"
    http_status = 422


class Unavailable(MemqError):
    """The service could not answer (e.g. its database is down); retry later."""

    code = "unavailable"
    http_status = 503
    retry_later = True


class Busy(MemqError):
    """The caller's app already holds its share of something the apps share
    (a query replica's request slots, or its reads waiting for a
    ``min_seq``): retry later. The message names the share; other apps'
    requests are not affected."""

    code = "busy"
    http_status = 429
    retry_later = True


class TemplateKeyMissing(MemqError):
    """An instruction template names a state key that is not set (and no ``?``)."""

    code = "template_key_missing"
    http_status = 422


class WrongEventLoop(MemqError):
    """A client called from an event loop other than the one its NATS
    connection was opened on (another thread's ``asyncio.run``, a framework's
    ``run_sync``): nats-py's connection serves only its own loop, so the call
    would wait its whole timeout and fail as if no service answered."""

    code = "wrong_event_loop"


class Internal(MemqError):
    """A bug in the worker, not in the request; its log has the traceback."""

    code = "internal"


ERRORS_BY_CODE: dict[str, type[MemqError]] = {
    cls.code: cls
    for cls in (
        MemqError,
        InvalidId,
        InvalidMessage,
        UnsupportedVersion,
        Oversize,
        SubjectMismatch,
        PublishFailed,
        PublishOutcomeUnknown,
        Conflict,
        NotFound,
        Forbidden,
        NotCommitted,
        InvalidRequest,
        Unavailable,
        Busy,
        TemplateKeyMissing,
        Internal,
    )
}


def validation_details(exc) -> str:
    """The first three problems of a pydantic ``ValidationError``, one line:
    ``loc: msg; …`` (duck-typed, so that this module needs no pydantic)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:3])


def error_from_dict(data: dict) -> MemqError:
    """Rebuild a typed error from its wire form ``{"code", "message"}``."""
    cls = ERRORS_BY_CODE.get(str(data.get("code")), MemqError)
    return cls(str(data.get("message", "")))
