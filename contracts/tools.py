"""Tool definitions agents can hand to their model, as OpenAI function JSON.

``search_memory`` lets the model search the user's long-term memory itself
(Hector's search tool); :func:`run_search_memory` executes a call of it
with a :class:`~memq.contracts.client.MemoryClient` and returns the text to send
back as the tool result.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memq.contracts.queries import MAX_K

if TYPE_CHECKING:
    from memq.contracts.client import MemoryClient

SEARCH_MEMORY: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search_memory",
        "description": (
            "Search the long-term memory of past conversations with this user. "
            "Use it when the user refers to something said earlier, or when facts "
            "about the user (names, dates, plans, preferences) would help."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for, in natural language or keywords."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_K,
                    "description": "How many memories to return (default 5).",
                },
                "mode": {
                    "type": "string",
                    "enum": ["hybrid", "keyword", "vector"],
                    "description": "hybrid (default): keywords and meaning; keyword: exact words; vector: meaning.",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}


async def run_search_memory(client: MemoryClient, user: str, arguments: str | dict[str, Any]) -> str:
    """Execute one ``search_memory`` call (its JSON ``arguments`` as the model
    sent them) and return the tool result: one line per memory, best first."""
    args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    results = await client.search(
        user, str(args["query"]), k=int(args.get("limit", 5)), mode=args.get("mode", "hybrid")
    )
    if not results.results:
        return "No memories found."
    lines = []
    for r in results.results:
        date = datetime.fromtimestamp(r.timestamp, tz=UTC).strftime("%Y-%m-%d")
        lines.append(f"- [{date}, {r.author}] {r.content}")
    return "\n".join(lines)
