"""Summarizers behind one Protocol (:mod:`.base`): the offline extractive one (the embedded
default) and an OpenAI-compatible LLM (:mod:`memq.workers.summarizer.llm`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from memq.workers.memory import extractive
from memq.workers.memory.extractive import Turn
from memq.workers.settings import SummarizerSettings
from memq.workers.summarizer.base import Summarizer


class ExtractiveSummarizer:
    """Keeps the sentences that carry names, dates, numbers and decisions
    (:mod:`memq.workers.memory.extractive`); offline and deterministic."""

    name = "extractive"

    async def summarize(self, turns: Sequence[Turn], *, previous: str | None, target_tokens: int) -> str:
        # Pure CPU work of a few ms per hundred turns: off the event loop anyway.
        return await asyncio.to_thread(extractive.summarize, turns, previous=previous, target_tokens=target_tokens)

    async def close(self) -> None:
        pass


def open_summarizer(settings: SummarizerSettings) -> Summarizer:
    if settings.kind == "llm":
        from memq.workers.summarizer.llm import LLMSummarizer

        return LLMSummarizer(settings.llm)
    return ExtractiveSummarizer()
