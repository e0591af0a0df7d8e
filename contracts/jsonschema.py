"""JSON Schema of every stream message, for producers in other languages.

``python -m memq.contracts.jsonschema [DIR]`` writes one ``<kind>.schema.json`` per
message kind and ``stream-message.schema.json`` for the union (any message on
``MEMQ_EVENTS``); the default DIR is ``contracts/schemas``, where the files
ship with the package. They are generated from the pydantic models, so the
models stay the single source of truth (a unit test keeps the files current).

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
  the standard one is accepted too).
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from memq.contracts.schemas import StreamMessage

DEFAULT_DIR = Path(__file__).with_name("schemas")
UNION_FILE = "stream-message.schema.json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Defaults that only help Python callers: the decoder needs `v` and the union
# tags (`kind`, part `type`) in the payload, and a generated `id` or `timestamp`
# would differ on every decode (a redelivery would look like a new event).
REQUIRED_ON_WIRE = ("v", "kind", "type", "id", "timestamp")


def message_classes() -> dict[str, type]:
    """The message model of each kind, in the union's order."""
    union = typing.get_args(StreamMessage)[0]
    return {cls.model_fields["kind"].default: cls for cls in typing.get_args(union)}


def _require_wire_fields(schema: dict[str, Any]) -> None:
    for model in [schema, *schema.get("$defs", {}).values()]:
        props = model.get("properties", {})
        wanted = [name for name in REQUIRED_ON_WIRE if name in props]
        if wanted:
            model["required"] = list(dict.fromkeys([*model.get("required", []), *wanted]))


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema, for every kind and for the union."""
    targets = {f"{kind.replace('.', '-')}.schema.json": cls for kind, cls in message_classes().items()}
    targets[UNION_FILE] = StreamMessage
    out = {}
    for filename, target in targets.items():
        schema = TypeAdapter(target).json_schema()
        _require_wire_fields(schema)
        if filename == UNION_FILE:
            schema["title"] = "StreamMessage"
            schema["description"] = "Any message on MEMQ_EVENTS, tagged by `kind`."
        out[filename] = {"$schema": DIALECT, **schema}
    return out


def export(directory: str | Path = DEFAULT_DIR) -> list[Path]:
    """Write every schema into ``directory`` (created if needed), remove
    schema files of kinds that no longer exist, and return the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    generated = schemas()
    for stale in directory.glob("*.schema.json"):
        if stale.name not in generated:
            stale.unlink()
    paths = []
    for filename, schema in generated.items():
        path = directory / filename
        path.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in export(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DIR):
        print(written)
