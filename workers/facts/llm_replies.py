"""What the LLM must answer, as pydantic models, and the checks of its replies.

Two replies: the facts extracted from a batch of turns (:class:`Extraction`)
and the decision about one candidate fact (:class:`DecisionReply`). The JSON
schema sent as the structured output is derived from these models
(:func:`sent_schema`), narrowed to the labels of the turns or facts actually
shown (an ``enum``), so a server that constrains its output to the schema
cannot cite a turn it was not given. A reply is still checked as if it could:
one that does not parse, breaks the schema, cites an unknown label or holds
an empty statement raises :class:`FactReplyInvalid` with the reason and the
reply (cut to :data:`RAW_CHARS`), which the worker retries, then dead-letters.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

RAW_CHARS = 2000  # of a bad reply, kept for the dead letter
MAX_STATEMENT_CHARS = 500

# Not sent: OpenAI's strict structured outputs refuse string lengths, and the
# checks they stand for are made here after the reply anyway. Array lengths
# are sent: they bound what a constrained decoder can generate.
_UNSENT = ("title", "default", "description", "minLength", "maxLength")


class FactReplyInvalid(ValueError):
    """The LLM's reply is not what was asked for: ``reason`` says why, ``raw`` is the reply (cut)."""

    def __init__(self, reason: str, raw: str):
        self.reason = reason
        self.raw = raw[:RAW_CHARS]
        super().__init__(f"invalid fact reply: {reason}")


class ExtractedFact(BaseModel):
    model_config = ConfigDict(extra="forbid")

    statement: str = Field(min_length=1, max_length=MAX_STATEMENT_CHARS)
    entities: list[str] = Field(max_length=20)
    sources: list[str] = Field(min_length=1)  # labels of the turns shown ("t1", ...)

    @field_validator("statement")
    @classmethod
    def _words(cls, value: str) -> str:
        value = " ".join(value.split())
        if not any(ch.isalnum() for ch in value):
            raise ValueError("the statement is empty")
        return value


class Extraction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    facts: list[ExtractedFact] = Field(max_length=50)


class DecisionReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["add", "merge", "invalidate", "none"]
    merge_into: str | None  # a label of the facts shown ("f1", ...), for a merge
    invalidates: list[str]  # labels of the facts shown, for an invalidation


def sent_schema(model: type[BaseModel], labels: dict[str, list[str]]) -> dict[str, Any]:
    """``model``'s JSON schema, references inlined, every object closed and all
    its properties required (OpenAI's strict mode asks both), and each property
    named in ``labels`` (at any depth; an array's items, or a nullable string)
    narrowed to those values."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def walk(node: Any, name: str | None = None) -> Any:
        if isinstance(node, list):
            return [walk(n, name) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return walk(copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]]), name)
        out = {k: v for k, v in node.items() if k not in _UNSENT}
        if out.get("type") == "object" and "properties" in out:
            out["properties"] = {k: walk(v, k) for k, v in out["properties"].items()}
            out["required"] = list(out["properties"])
            out["additionalProperties"] = False
        elif name in labels and out.get("type") == "string":
            out["enum"] = list(labels[name])
        else:
            out = {k: walk(v, name) for k, v in out.items()}
        return out

    return walk(schema)


def parse(model: type[BaseModel], content: str) -> Any:
    """``content`` as ``model``, else :class:`FactReplyInvalid` (not JSON, or a schema breach)."""
    try:
        data = json.loads(content)
    except ValueError as e:
        raise FactReplyInvalid(f"not JSON ({e})", content) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the reply"
        raise FactReplyInvalid(f"{where}: {first['msg']} ({e.error_count()} error(s))", content) from None


def check_labels(labels: list[str], known: set[str], what: str, content: str) -> None:
    """Raise :class:`FactReplyInvalid` for a label not in ``known``."""
    unknown = sorted(set(labels) - known)
    if unknown:
        raise FactReplyInvalid(f"unknown {what} {', '.join(map(repr, unknown))}", content)
