"""JSON Schema of every stream message and every query, for agents in other languages.

``python -m memq.contracts.jsonschema [DIR]`` writes one ``<kind>.schema.json`` per
message kind and ``stream-message.schema.json`` for the union (any message on
``MEMQ_EVENTS``), and under ``queries/`` the request and the reply of every
query op (:data:`memq.contracts.queries.OPS`): ``<op>.request.schema.json``,
``<op>.reply.schema.json`` (the envelope of :mod:`memq.contracts.replies`,
tagged by ``ok``) and ``error-reply.schema.json``. The default DIR is
``contracts/schemas``, where the files ship with the package. They are
generated from the pydantic models, so the models stay the single source of
truth (a unit test keeps the files current).

What JSON Schema cannot say, and a producer must still respect:

- ids (``app``, ``user``, ``session``, message ids) are 1..256 bytes of
  UTF-8 without NUL (U+0000), which PostgreSQL cannot store; nor may state
  keys, artifact file names and object names hold NUL;
- integers anywhere in free-form JSON (state, metadata, data parts, tool
  arguments and results) fit in 64 bits (-2**63 .. 2**64-1);
- the subject is ``memq.v1.ev.<app>.<user>[.<session>]`` with ids encoded by
  :func:`memq.contracts.ids.encode_token`, and must name the same ids as the body;
- an artifact has exactly one of ``inline`` and ``object``;
- the ``Nats-Msg-Id`` header is the message ``id`` (``event.id`` for events),
  escaped like a subject token (:func:`memq.contracts.ids.encode_token`: plain
  ``[A-Za-z0-9_-]`` ids are unchanged);
- ``inline`` artifact bytes are base64 (URL-safe alphabet when we emit them;
  the standard one is accepted too);
- a query goes to ``memq.v1.q.<app>.<op>`` (app encoded as above) and must
  name that same app in its body.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from memq.contracts.queries import OPS
from memq.contracts.replies import ErrorReply, reply_type
from memq.contracts.schemas import StreamMessage

DEFAULT_DIR = Path(__file__).with_name("schemas")
UNION_FILE = "stream-message.schema.json"
QUERIES_DIR = "queries"
ERROR_REPLY_FILE = f"{QUERIES_DIR}/error-reply.schema.json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Defaults that only help Python callers: the decoder needs `v` and the union
# tags (`kind`, part `type`) in the payload, and a generated `id` or `timestamp`
# would differ on every decode (a redelivery would look like a new event).
REQUIRED_ON_WIRE = ("v", "kind", "type", "id", "timestamp")


def message_classes() -> dict[str, type[BaseModel]]:
    """The message model of each kind, in the union's order."""
    union = typing.get_args(StreamMessage)[0]
    return {cls.model_fields["kind"].default: cls for cls in typing.get_args(union)}


def _require_wire_fields(schema: dict[str, Any]) -> None:
    for model in [schema, *schema.get("$defs", {}).values()]:
        props = model.get("properties", {})
        wanted = [name for name in REQUIRED_ON_WIRE if name in props]
        if wanted:
            model["required"] = list(dict.fromkeys([*model.get("required", []), *wanted]))


def file_stem(name: str) -> str:
    """A message kind's or query op's name as a file name: ``session.get`` -> ``session-get``."""
    return name.replace(".", "-")


def request_file(op: str) -> str:
    return f"{QUERIES_DIR}/{file_stem(op)}.request.schema.json"


def reply_file(op: str) -> str:
    return f"{QUERIES_DIR}/{file_stem(op)}.reply.schema.json"


# Where a schema's nested models are referenced: in the schema itself (a
# standalone file); the AsyncAPI document passes its own components instead.
LOCAL_REFS = "#/$defs/{model}"


def message_schema(target: Any, ref_template: str = LOCAL_REFS) -> dict[str, Any]:
    """A stream message kind's model, or the union, as a producer must write it."""
    schema = TypeAdapter(target).json_schema(ref_template=ref_template)
    _require_wire_fields(schema)
    if target is StreamMessage:
        schema["title"] = "StreamMessage"
        schema["description"] = "Any message on MEMQ_EVENTS, tagged by `kind`."
    return schema


def request_schema(op: str, ref_template: str = LOCAL_REFS) -> dict[str, Any]:
    """What a request of ``op`` may say (``v`` is required on the wire)."""
    schema = OPS[op].request.model_json_schema(mode="validation", ref_template=ref_template)
    _require_wire_fields(schema)
    schema["title"] = f"{op} request"
    schema["description"] = _described(f"{OPS[op].summary} Sent to memq.v1.q.<app>.{op}.", schema)
    return schema


def reply_schema(op: str, ref_template: str = LOCAL_REFS) -> dict[str, Any]:
    """What the service answers to ``op``: its result, or an error."""
    schema = TypeAdapter(reply_type(OPS[op].reply)).json_schema(mode="serialization", ref_template=ref_template)
    schema["title"] = f"{op} reply"
    schema["description"] = f'`{{"ok": true, "result": {OPS[op].reply.__name__}}}`, or an error reply.'
    return schema


def error_reply_schema(ref_template: str = LOCAL_REFS) -> dict[str, Any]:
    return ErrorReply.model_json_schema(mode="serialization", ref_template=ref_template)


def _described(summary: str, schema: dict[str, Any]) -> str:
    """``summary``, then the model's own docstring if it has one."""
    return f"{summary}\n\n{schema['description']}" if schema.get("description") else summary


def query_schemas() -> dict[str, dict[str, Any]]:
    """Relative path -> JSON Schema, for every op's request and reply and the error reply."""
    out = {}
    for op in OPS:
        out[request_file(op)] = request_schema(op)
        out[reply_file(op)] = reply_schema(op)
    out[ERROR_REPLY_FILE] = error_reply_schema()
    return out


def message_schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema, for every kind and for the union."""
    targets: dict[str, Any] = {f"{file_stem(kind)}.schema.json": cls for kind, cls in message_classes().items()}
    targets[UNION_FILE] = StreamMessage
    return {filename: message_schema(target) for filename, target in targets.items()}


def schemas() -> dict[str, dict[str, Any]]:
    """Relative path -> JSON Schema file: the stream messages, then the queries."""
    return {path: {"$schema": DIALECT, **schema} for path, schema in {**message_schemas(), **query_schemas()}.items()}


def export(directory: str | Path = DEFAULT_DIR) -> list[Path]:
    """Write every schema into ``directory`` (created if needed), remove
    schema files of kinds and ops that no longer exist, and return the paths written."""
    directory = Path(directory)
    generated = schemas()
    for stale in directory.rglob("*.schema.json"):
        if stale.relative_to(directory).as_posix() not in generated:
            stale.unlink()
    paths = []
    for relative, schema in generated.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in export(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DIR):
        print(written)
