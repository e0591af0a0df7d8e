"""memq contracts: message schemas, subjects and the client an agent installs.

Light dependencies only (nats-py, orjson, pydantic); never imports ``workers``.
"""

from contracts.client import MemoryClient, SessionRef
from contracts.errors import MemqError
from contracts.schemas import (
    Actions,
    DataPart,
    Event,
    FilePart,
    Message,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

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
