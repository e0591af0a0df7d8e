"""The query reply envelope, for the service that writes it and the client
that reads it: ``{"ok": true, "result": …}`` or ``{"ok": false, "error":
{"code": …, "message": …}}``, where ``error`` is :meth:`MemqError.to_dict
<memq.contracts.errors.MemqError.to_dict>` and ``result`` the op's reply
model (:data:`memq.contracts.queries.OPS`).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Generic, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from memq.contracts.errors import ERRORS_BY_CODE, MemqError, error_from_dict, validation_details
from memq.contracts.queries import OPS

# A message may quote the request (a 200 kB "v", say), and a reply over
# NATS' max_payload never reaches the requester.
MAX_ERROR_MESSAGE = 2000

R = TypeVar("R", bound=BaseModel)


class ErrorInfo(BaseModel):
    """Why a request was refused or failed."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    code: str = Field(
        description="stable and machine-readable; a code this client does not know reads as a plain error",
        examples=sorted(ERRORS_BY_CODE),
    )
    # Not enforced on reading: a longer message from another server is still an answer.
    message: str = Field(description=f"for people, at most {MAX_ERROR_MESSAGE} characters; may change between releases")


class OkReply(BaseModel, Generic[R]):
    model_config = ConfigDict(extra="ignore", frozen=True)

    ok: Literal[True]
    result: R


class ErrorReply(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    ok: Literal[False]
    error: ErrorInfo


def reply_type(reply: type[R]) -> Any:
    """The envelope of one op's reply model, tagged by ``ok``."""
    return Annotated[OkReply[reply] | ErrorReply, Field(discriminator="ok")]  # type: ignore[valid-type]


# One adapter per op, built once: parsing is on every read's path.
_ADAPTERS: dict[str, TypeAdapter[Any]] = {name: TypeAdapter(reply_type(op.reply)) for name, op in OPS.items()}


def ok_body(result: BaseModel) -> bytes:
    # Spliced rather than wrapped in OkReply and dumped again: on the hot path,
    # and the bytes are the same.
    return b'{"ok":true,"result":' + _result_json(result) + b"}"


# Values orjson would write otherwise than pydantic (datetimes, str and int
# subclasses such as str enums, dataclasses) go to _plain_fields, which
# refuses them, so that the reply is written by pydantic instead.
_PASSTHROUGH = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def _result_json(result: BaseModel) -> bytes:
    """``result.model_dump_json()``, by orjson where that writes the same JSON.
    A context of 150 messages (47 kB) takes 14 µs instead of 64 µs, and
    pydantic's dump was 13 % of the query worker's CPU at 64 agents
    (tests/bench/agent_loop.py, py-spy). Whatever orjson cannot write
    (bytes, sets, non-string keys, integers past 64 bits, a model with
    aliases or serializers) falls back to pydantic."""
    try:
        return orjson.dumps(result, default=_plain_fields, option=_PASSTHROUGH)
    except TypeError:  # orjson.JSONEncodeError is one
        return result.model_dump_json().encode()


def _plain_fields(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel) and _dumps_as_fields(type(value)):
        return {name: getattr(value, name) for name in type(value).model_fields}
    raise TypeError(f"left to pydantic: {type(value).__name__}")


@functools.cache
def _dumps_as_fields(model: type[BaseModel]) -> bool:
    """Whether pydantic's JSON of ``model`` is its fields, in order, under their names."""
    decorators = model.__pydantic_decorators__
    return (
        model.model_config.get("extra") != "allow"
        and not model.model_computed_fields
        and not decorators.field_serializers
        and not decorators.model_serializers
        and all(
            f.alias is None and f.serialization_alias is None and not f.exclude for f in model.model_fields.values()
        )
    )


def error_body(exc: MemqError) -> bytes:
    error = exc.to_dict()
    error["message"] = error["message"][:MAX_ERROR_MESSAGE]
    return orjson.dumps({"ok": False, "error": error})


def parse_reply(op: str, data: bytes) -> Any:
    """Decode a reply to ``op`` into its typed model, or raise the typed
    error the service sent back (:func:`memq.contracts.errors.error_from_dict`)."""
    try:
        # validate_json (not orjson + validate_python) so that bytes fields decode from base64.
        reply = _ADAPTERS[op].validate_json(data)
    except ValidationError as exc:
        raise MemqError(f"malformed {op} reply from the query service: {validation_details(exc)}") from None
    if isinstance(reply, ErrorReply):
        raise error_from_dict(reply.error.model_dump())
    return reply.result
