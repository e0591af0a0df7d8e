"""memq contracts: message schemas, subjects and the client an agent installs.

Light dependencies only (nats-py, orjson, pydantic); never imports ``workers``.
"""

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
