"""The gateway's inputs, bounded by the contract's request models.

A limit is said once, on the field of :mod:`memq.contracts.queries` that the
query service checks; a query parameter or body field here takes that
field's bounds (and default), so the gateway refuses at its door what the
service would refuse, and its OpenAPI document shows the same limits.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import Query
from pydantic import BaseModel

_BOUNDS = ("gt", "ge", "lt", "le", "min_length", "max_length")


def bounds(model: type[BaseModel], name: str) -> dict[str, Any]:
    """The numeric and length bounds of ``model``'s field ``name``."""
    found: dict[str, Any] = {}
    for item in model.model_fields[name].metadata:
        # annotated_types' Ge, MaxLen… and pydantic's own metadata name their bound as Query does
        found.update({k: getattr(item, k) for k in _BOUNDS if getattr(item, k, None) is not None})
    return found


def query(model: type[BaseModel], name: str, description: str | None = None) -> Any:
    """A ``Query()`` with the bounds of ``model``'s field ``name``."""
    return Query(description=description or model.model_fields[name].description, **bounds(model, name))


def field(model: type[BaseModel], name: str) -> Any:
    """A body field as ``model``'s field ``name`` is: its default, bounds and description."""
    return copy.copy(model.model_fields[name])
