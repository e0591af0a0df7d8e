"""Checkpoint summaries from any OpenAI-compatible chat completions endpoint.

``POST {base_url}/chat/completions`` with ``[system: instructions, user: the
rendered prompt]``; the reply's ``choices[0].message.content`` is the summary.
Works with OpenAI, vLLM, Ollama and the llama.cpp server. The summary is
hierarchical: the previous checkpoint's summary is folded into the new one.

The reply is trimmed and, if longer than the target (counted with
:func:`memq.workers.memory.tokens.count_text`, which may differ from the model's own
tokenizer), cut at a sentence or word boundary. The API key is sent only as a
Bearer header and never appears in logs or errors.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import httpx

from memq.workers import http_retry
from memq.workers.memory.extractive import Turn, format_turn
from memq.workers.memory.tokens import count_text
from memq.workers.settings import LLMSettings
from memq.workers.summarizer.base import SummarizerError

log = logging.getLogger("memq.summarizer.llm")

# Backoff between attempts: RETRY_BASE_S * 2**attempt (with jitter), or the
# server's Retry-After, both capped at RETRY_MAX_S. Tests make them tiny.
RETRY_BASE_S = 1.0
RETRY_MAX_S = 30.0
WORDS_PER_TOKEN = 0.75  # English prose; {target_words} in the prompt
ELLIPSIS = "…"

SYSTEM_PROMPT = (
    "You maintain the running summary of a conversation for an assistant's memory. "
    "Write plain, factual prose in the third person. Reply with the summary only."
)
DEFAULT_PROMPT = """\
Previous summary:
{previous_summary}

New messages:
{conversation}

Write one concise summary of at most {target_words} words that folds the previous \
summary and the new messages together. Keep every name, date, number and decision; \
drop greetings and small talk."""
NO_PREVIOUS = "(none)"


class LLMSummarizer:
    """Summaries from an OpenAI-compatible chat endpoint.

    Parameters (``LLMSettings``):
        base_url: the ``/v1`` root (default ``https://api.openai.com/v1``).
        api_key: sent as ``Authorization: Bearer``; unset (default) sends none.
        model: the chat model (default ``gpt-4o-mini``).
        summarizer_model: a cheaper model used instead when set (default None).
        prompt: the user message template with ``{previous_summary}``,
            ``{conversation}`` and ``{target_words}`` (default
            :data:`DEFAULT_PROMPT`); other braces are left as they are.
        max_tokens: reply limit (default None: the summary's ``target_tokens``).
        temperature: default 0.2.
        timeout_s: the whole request, per attempt (default 60).
        retries: extra attempts on timeouts, connection errors, 429 and 5xx
            (default 2); any other 4xx fails at once.

    Keyword parameters:
        token_model: whose tokenizer counts ``target_tokens`` (default None:
            ``cl100k_base``).
    """

    def __init__(self, settings: LLMSettings, *, token_model: str | None = None):
        self.settings = s = settings
        self.model = s.summarizer_model or s.model
        self.name = f"llm:{self.model}"
        self.token_model = token_model
        self._endpoint = http_retry.ChatEndpoint(s, error=SummarizerError)

    async def summarize(self, turns: Sequence[Turn], *, previous: str | None, target_tokens: int) -> str:
        """A summary of ``previous`` then ``turns`` in at most ``target_tokens``
        tokens. Raises :class:`SummarizerError` when no summary can be had."""
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": self.render(turns, previous=previous, target_tokens=target_tokens)},
            ],
            "max_tokens": self.settings.max_tokens or target_tokens,
            "temperature": self.settings.temperature,
        }
        text = _content(await self._post(body), self._endpoint.where)
        summary = fit(text, target_tokens, self.token_model)
        if not summary:
            raise SummarizerError(f"{self._endpoint.where}: not a word of the reply fits {target_tokens} tokens")
        return summary

    def render(self, turns: Sequence[Turn], *, previous: str | None, target_tokens: int) -> str:
        """The user message: the template with its three fields filled."""
        values = {
            "{previous_summary}": (previous or "").strip() or NO_PREVIOUS,
            "{conversation}": "\n".join(format_turn(t) for t in turns),
            "{target_words}": str(max(1, int(target_tokens * WORDS_PER_TOKEN))),
        }
        # One pass, not str.format: a custom template may hold JSON braces, and
        # a turn's text containing "{target_words}" must stay as it is.
        pattern = re.compile("|".join(re.escape(k) for k in values))
        return pattern.sub(lambda m: values[m.group()], self.settings.prompt or DEFAULT_PROMPT)

    async def close(self) -> None:
        await self._endpoint.close()

    # --- one request, with retries -------------------------------------------

    async def _post(self, body: dict) -> httpx.Response:
        return await self._endpoint.post(body, what="summary", base_s=RETRY_BASE_S, max_s=RETRY_MAX_S, logger=log)


def _content(reply: httpx.Response, where: str) -> str:
    try:
        content = reply.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise SummarizerError(f"{where}: not a chat completion reply") from None
    if not isinstance(content, str) or not content.strip():
        raise SummarizerError(f"{where}: the reply has no content")
    return content.strip()


# A sentence ends at . ! ? (maybe closed by quotes or brackets) before
# whitespace or the end; a line break ends one too (bullets, lists).
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*(?=\s|$)|(?=\n)")


def fit(text: str, limit: int, model: str | None = None) -> str:
    """``text`` if it has at most ``limit`` tokens, else its longest prefix that
    does: ending at a sentence boundary when that keeps at least half the
    limit, else at a word boundary followed by "…"; "" if not even a word fits."""
    if count_text(text, model) <= limit:
        return text
    sentence_cut = _longest(text, [m.end() for m in _SENTENCE_END.finditer(text)], limit, model, "")
    if count_text(sentence_cut, model) * 2 >= limit:
        return sentence_cut
    word_cut = _longest(text, [m.start() for m in re.finditer(r"\s+", text)], limit, model, ELLIPSIS)
    return max(sentence_cut, word_cut, key=len)


def _longest(text: str, cuts: list[int], limit: int, model: str | None, suffix: str) -> str:
    """The longest ``text[:cut].rstrip() + suffix`` within ``limit`` tokens (binary search)."""

    def piece(k: int) -> str:
        head = text[: cuts[k]].rstrip()
        return head + suffix if head else ""

    lo, hi = -1, len(cuts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count_text(piece(mid), model) <= limit else (lo, mid - 1)
    while lo >= 0 and count_text(piece(lo), model) > limit:  # BPE counts are not quite monotonic
        lo -= 1
    return piece(lo) if lo >= 0 else ""
