"""`memq`'s read options, taken from the contract's requests.

A read command's option for a request field gets that field's bounds and
description from the request's JSON Schema
(``memq.contracts/schemas/queries/<op>.request.schema.json``, generated from
:mod:`memq.contracts.queries`, checked up to date by
tests/unit/test_jsonschema.py): an out-of-range value gets click's usage
error (exit 2) before anything is sent, ``--help`` shows the limit, and a
changed bound changes the option with it. The committed schema is read, not
the pydantic models: ``memq --help`` does not import the contract's models
(tests/unit/test_cli_startup.py). tests/unit/test_cli_fields.py holds each
read command to an option for every field of its request, with the field's
bounds and default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from typing import Any

import typer

# A read command's op -> its request schema file (memq.contracts.jsonschema.request_file).
_SCHEMAS = "schemas/queries"
# typer's overloads take no **kwargs of a dict (mypy): the keywords are checked by typer as it builds the option.
_OPTION: Any = typer.Option


@cache
def request_schema(op: str) -> dict[str, Any]:
    """The committed JSON Schema of ``op``'s request."""
    path = files("memq.contracts").joinpath(_SCHEMAS, f"{op.replace('.', '-')}.request.schema.json")
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """A field's own schema: through a ``$ref`` and an ``anyOf`` with null (an optional field)."""
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    branches = [b for b in schema.get("anyOf", ()) if b.get("type") != "null"]
    if len(branches) == 1:
        outer = {k: v for k, v in schema.items() if k != "anyOf"}
        return {**_resolve(branches[0], root), **outer}
    return schema


def field_schema(op: str, name: str) -> dict[str, Any]:
    """The schema of request field ``name`` of ``op``; ``strategy.window``
    is a field of a nested model."""
    root = request_schema(op)
    schema: dict[str, Any] = {"properties": root["properties"]}
    for part in name.split("."):
        schema = _resolve(schema["properties"][part], root)
    return schema


def _range(schema: dict[str, Any]) -> str:
    """A number's bounds as click shows a range: ``0<x<=1``."""
    low = next((f"{schema[k]}{op}" for k, op in (("minimum", "<="), ("exclusiveMinimum", "<")) if k in schema), "")
    high = next((f"{op}{schema[k]}" for k, op in (("maximum", "<="), ("exclusiveMaximum", "<")) if k in schema), "")
    return f"{low}x{high}"


def _limits(schema: dict[str, Any]) -> tuple[dict[str, Any], Callable[[Any], Any] | None, str]:
    """How an option holds to a field's bounds: typer's ``min``/``max`` where
    they say it all (``--help`` shows the range, click refuses a number out of
    it), else a callback (an open bound, a text's length, how many times a
    repeated option is given) and a note for the help."""
    rules = {
        k: schema[k]
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "maxItems")
        if k in schema
    }
    if schema.get("type") in ("integer", "number") and not {"exclusiveMinimum", "exclusiveMaximum"} & set(rules):
        return {k: rules[key] for k, key in (("min", "minimum"), ("max", "maximum")) if key in rules}, None, ""
    if not rules:
        return {}, None, ""
    if "maxItems" in rules:
        note = f"at most {rules['maxItems']} times"
    elif "maxLength" in rules:
        note = f"at most {rules['maxLength']} characters"
    else:
        note = _range(schema)

    def check(value: Any) -> Any:
        if value is None:
            return value
        if schema.get("type") in ("integer", "number"):
            within = (
                value >= rules.get("minimum", value)
                and value <= rules.get("maximum", value)
                and ("exclusiveMinimum" not in rules or value > rules["exclusiveMinimum"])
                and ("exclusiveMaximum" not in rules or value < rules["exclusiveMaximum"])
            )
            if not within:
                raise typer.BadParameter(f"{value} is not in the range {_range(schema)}.")
        elif "maxItems" in rules and len(value) > rules["maxItems"]:
            raise typer.BadParameter(f"given {len(value)} times: at most {rules['maxItems']}.")
        elif len(value) < rules.get("minLength", 0):
            raise typer.BadParameter(f"{len(value)} characters: at least {rules['minLength']}.")
        elif len(value) > rules.get("maxLength", len(value)):
            raise typer.BadParameter(f"{len(value)} characters: at most {rules['maxLength']}.")
        return value

    return {}, check, note


def _help(text: str | None, note: str) -> str | None:
    return f"{text}  [{note}]" if text and note else text


def choices(schema: dict[str, Any]) -> tuple[str, ...]:
    """The values a field may take (a Literal's ``enum``), or of each of its
    items (a list of a Literal); ``()``: any."""
    return tuple(schema.get("enum") or schema.get("items", {}).get("enum") or ())


def _choosing(values: tuple[str, ...], check: Callable[[Any], Any] | None) -> dict[str, Any]:
    """An option's keywords that hold it to ``values``: click's usage error
    (exit 2) for any other, the choices in ``--help`` and shell completion.
    A callback, not an Enum type: typer takes no list of a Literal, and an
    Enum would restate the contract's values."""

    def pick(value: Any) -> Any:
        for v in value if isinstance(value, list | tuple) else () if value is None else (value,):
            if v not in values:
                raise typer.BadParameter(f"{v!r} is not one of {', '.join(map(repr, values))}.")
        return check(value) if check else value

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return {"callback": pick, "autocompletion": complete, "metavar": f"<{'|'.join(values)}>"}


def option(op: str, name: str, *decls: str, help: str | None = None, **extra: Any) -> Any:
    """A ``typer.Option`` for field ``name`` of ``op``'s request: its bounds
    and its choices (a usage error, exit 2, before anything is sent) and,
    without ``help``, its description. The command's parameter is named as
    the field."""
    schema = field_schema(op, name)
    closed, check, note = _limits(schema)
    text = _help(help or _sentence(schema.get("description")), note)
    values = choices(schema)
    held = _choosing(values, check) if values else {"callback": check}
    return _OPTION(*decls, help=text, **held, **closed, **extra)


def argument(op: str, name: str, *, help: str | None = None) -> Any:
    """A ``typer.Argument`` for field ``name`` of ``op``'s request, as :func:`option`."""
    schema = field_schema(op, name)
    closed, check, note = _limits(schema)
    return typer.Argument(help=_help(help or _sentence(schema.get("description")), note), callback=check, **closed)


def _sentence(text: str | None) -> str | None:
    return f"{text[0].upper()}{text[1:]}." if text else None
