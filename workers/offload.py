"""Tokenizing a caller's long text off the event loop.

One event loop answers every app of a worker process, so counting one app's
long text on it delays every other app's reads by as long. tiktoken
releases the GIL while it encodes, so in a thread the count runs beside the
loop; short texts, nearly every request's, stay on the loop, where they cost
less than the hop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

# Measured on the 2-core dev VM, mixed-script words: 1.4 ms per 16 K
# characters on the loop, 100 ms per 1 M (query.max_instruction_chars); a
# thread hop costs 0.06 ms.
OFF_LOOP_CHARS = 16_384

R = TypeVar("R")


async def off_loop(chars: int, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)``, which tokenizes about ``chars`` characters of
    a caller's text: in a thread from :data:`OFF_LOOP_CHARS` on, else here."""
    if chars < OFF_LOOP_CHARS:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)
