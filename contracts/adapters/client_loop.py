"""The sync side of an adapter: a framework's sync methods (LangChain's
``messages``, LangGraph's ``batch`` and sync hooks) hand their coroutine to
the event loop its :class:`~memq.contracts.client.MemoryClient` runs on, from
another thread, and wait for the result there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class NoClientLoop(RuntimeError, asyncio.InvalidStateError):
    """A sync method cannot reach its client's loop: none is known or running,
    or it was called on that very loop (waiting would block it). Both a
    RuntimeError, as LangChain's callers catch, and asyncio's
    InvalidStateError, as LangGraph's do."""


class ClientLoop:
    """The client's event loop, as an adapter named ``owner`` knows it:
    given, the one running when the adapter is made, or the one its first
    async method runs on (:meth:`remember`). ``instead`` names the async
    methods an error message points to."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, *, owner: str, instead: str):
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self.loop = loop
        self.owner, self.instead = owner, instead

    def remember(self) -> None:
        """Called from the adapter's async methods: the loop they run on is the client's."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()

    def wait(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the client's loop from this (another) thread and return its result."""
        loop = self.loop
        if loop is None or not loop.is_running():
            work.close()
            raise NoClientLoop(
                f"{self.owner}'s sync methods run on the event loop of its MemoryClient, and none is known or "
                f"running: pass loop= (the client's loop) when making it in another thread, or use the async "
                f"methods ({self.instead})"
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            work.close()
            raise NoClientLoop(
                f"a sync {self.owner} method was called on its client's own event loop, where waiting would "
                f"block that loop: use the async methods ({self.instead})"
            )
        return asyncio.run_coroutine_threadsafe(work, loop).result()
