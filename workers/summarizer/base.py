"""What every summarizer is: the Protocol the worker calls, and the error
that means "not now, retry later". Its own module so that the summarizers
(:mod:`.summarizers`, :mod:`.llm`) import it and not each other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from memq.workers.memory.extractive import Turn


class SummarizerError(Exception):
    """The summary could not be made now (endpoint down, timeout, bad reply); retry later."""


@runtime_checkable
class Summarizer(Protocol):
    name: str

    async def summarize(self, turns: Sequence[Turn], *, previous: str | None, target_tokens: int) -> str:
        """A summary of ``previous`` (the last checkpoint's summary, or None)
        followed by ``turns``, in about ``target_tokens`` tokens."""

    async def close(self) -> None: ...
