"""memq contracts: message schemas, subjects and the client an agent installs.

Light dependencies only (nats-py, orjson, pydantic); never imports ``workers``.

The names below load on first use (PEP 562): importing one module of the
package (``memq.contracts.queries`` for its types, as the ``memq`` command
does) then costs that module, not the client and nats-py too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memq.contracts.client import MemoryClient, SessionRef
    from memq.contracts.errors import MemqError
    from memq.contracts.schemas import (
        Actions,
        DataPart,
        Event,
        FilePart,
        Message,
        TextPart,
        ToolCallPart,
        ToolResultPart,
    )

_WHERE = {
    "MemoryClient": "client",
    "SessionRef": "client",
    "MemqError": "errors",
    **{
        name: "schemas"
        for name in (
            "Actions",
            "DataPart",
            "Event",
            "FilePart",
            "Message",
            "TextPart",
            "ToolCallPart",
            "ToolResultPart",
        )
    },
}

__all__ = [
    "Actions",
    "DataPart",
    "Event",
    "FilePart",
    "MemoryClient",
    "MemqError",
    "Message",
    "SessionRef",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # once
    return value
