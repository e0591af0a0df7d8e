"""The two LLM calls of fact extraction, against any OpenAI-compatible
``POST {base_url}/chat/completions`` with a structured output:

- :meth:`FactLLM.extract`: a session's new user and assistant turns (formatted
  as the summarizer formats them, each behind a label ``[t1]``, ``[t2]``…) in,
  candidate facts about the user out, each citing the turns it comes from;
- :meth:`FactLLM.decide`: one candidate and the user's current facts that
  match it (labelled ``[f1]``…) in, a :class:`~memq.workers.memory.facts.Decision`
  out (add, merge, invalidate or none). With no fact to compare, the answer is
  ``add`` and no call is made.

Labels rather than event or fact ids: short, and the schema sent allows only
the labels shown. The structured output is ``response_format`` either
``{"type": "json_schema", "json_schema": {...}}`` (OpenAI, vLLM, llama.cpp's
``llama-server``: the default) or ``{"type": "json_object", "schema": {...}}``
(llama-cpp-python's server, which refuses ``json_schema`` with an HTTP 500,
and llama-server too). A reply that is not what was asked raises
:class:`~memq.workers.facts.llm_replies.FactReplyInvalid`; an endpoint that cannot
be reached or answers an error raises :class:`FactLLMError`. HTTP and retries
are :func:`memq.workers.http_retry.post_json`'s, as the LLM summarizer's.

Not a worker kind yet: nothing runs this but the tests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from memq.workers import http_retry
from memq.workers.facts.llm_replies import (
    DecisionReply,
    Extraction,
    FactReplyInvalid,
    check_labels,
    parse,
    sent_schema,
)
from memq.workers.memory.extractive import Turn, format_turn
from memq.workers.memory.facts import Candidate, Decision, Fact, Source
from memq.workers.settings import LLMSettings

log = logging.getLogger("memq.facts.llm")

RETRY_BASE_S = 1.0  # as the summarizer's: tests make them tiny
RETRY_MAX_S = 30.0

ResponseFormat = Literal["json_schema", "json_object"]

EXTRACT_SYSTEM = (
    "You extract facts about the user from a conversation, for an assistant's long-term memory. Reply with JSON only."
)
EXTRACT_PROMPT = """\
Conversation (each turn has a label in brackets):
{turns}

List the facts these turns state about the user: who they are, what they like, \
plan, did, own or decided. Each fact is one short sentence in the third person \
(statement), the names of the people, places and things it mentions (entities), \
and the labels of the turns it comes from (sources). Leave out greetings, \
questions and small talk; an empty list when nothing is left."""

DECIDE_SYSTEM = "You keep an assistant's memory of facts about a user current. Reply with JSON only."
DECIDE_PROMPT = """\
Known facts (each has a label in brackets):
{facts}

New fact: {statement}

Decide what the new fact does: "add" if it is new information; "merge" if it \
says the same as a known fact (merge_into: its label); "invalidate" if it \
contradicts known facts, which stop being true (invalidates: their labels); \
"none" if it is not worth keeping."""


class FactLLMError(Exception):
    """The endpoint could not be asked now (down, timeout, an HTTP error): the worker holds and retries."""


@dataclass(frozen=True)
class Said:
    """A turn to extract from, and the event it is (its facts' source)."""

    source: Source
    turn: Turn


@dataclass(frozen=True)
class Usage:
    """Calls made and the tokens the endpoint reported for them (none counted where it reports none)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


class FactLLM:
    """Fact extraction and reconciliation decisions from a chat endpoint.

    ``settings`` (:class:`~memq.workers.settings.LLMSettings`): ``base_url``,
    ``api_key`` (a Bearer header, never logged), ``model``, ``temperature``,
    ``timeout_s`` and ``retries`` as for the summarizer; ``max_tokens``
    bounds each reply (default :data:`MAX_TOKENS`); ``prompt`` and
    ``summarizer_model`` are the summarizer's and not used here.
    ``response_format``: see the module doc. ``transport``: httpx's (tests
    answer from a script with ``httpx.MockTransport``).
    """

    MAX_TOKENS = 512

    def __init__(
        self,
        settings: LLMSettings,
        *,
        response_format: ResponseFormat = "json_schema",
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.settings = s = settings
        self.model = s.model
        self.response_format = response_format
        self.usage = Usage()  # since this client was made, for metrics
        self._endpoint = http_retry.ChatEndpoint(s, error=FactLLMError, transport=transport)

    async def extract(
        self, app: str, user: str, turns: Sequence[Said], *, spent: list[Usage] | None = None
    ) -> list[Candidate]:
        """Candidate facts about ``user`` stated in ``turns`` (none for no turns).
        ``spent``: this call's usage is appended to it (a worker charges it to the app)."""
        if not turns:
            return []
        labels = {f"t{i}": said for i, said in enumerate(turns, start=1)}
        prompt = EXTRACT_PROMPT.format(turns="\n".join(f"[{k}] {format_turn(s.turn)}" for k, s in labels.items()))
        schema = sent_schema(Extraction, {"sources": list(labels)})
        content = await self._ask(EXTRACT_SYSTEM, prompt, "facts", schema, spent)
        reply: Extraction = parse(Extraction, content)
        out = []
        for fact in reply.facts:
            check_labels(fact.sources, set(labels), "turn label", content)
            out.append(
                Candidate(
                    app=app,
                    user=user,
                    statement=fact.statement,
                    entities=tuple(fact.entities),
                    sources=tuple(labels[k].source for k in fact.sources),
                )
            )
        return out

    async def decide(
        self, candidate: Candidate, matches: Sequence[Fact], *, spent: list[Usage] | None = None
    ) -> Decision:
        """What ``candidate`` does to the user's facts, given the current facts that match it."""
        if not matches:
            return Decision("add")
        labels = {f"f{i}": fact for i, fact in enumerate(matches, start=1)}
        listed = "\n".join(f"[{k}] {f.statement}" for k, f in labels.items())
        prompt = DECIDE_PROMPT.format(facts=listed, statement=candidate.statement)
        schema = sent_schema(DecisionReply, {"merge_into": list(labels), "invalidates": list(labels)})
        content = await self._ask(DECIDE_SYSTEM, prompt, "decision", schema, spent)
        reply: DecisionReply = parse(DecisionReply, content)
        if reply.action == "merge":
            if reply.merge_into is None:
                raise FactReplyInvalid("a merge without merge_into", content)
            check_labels([reply.merge_into], set(labels), "fact label", content)
            return Decision("merge", merge_into=labels[reply.merge_into].id)
        if reply.action == "invalidate":
            if not reply.invalidates:
                raise FactReplyInvalid("an invalidation naming no fact", content)
            check_labels(reply.invalidates, set(labels), "fact label", content)
            return Decision("invalidate", invalidates=tuple(labels[k].id for k in reply.invalidates))
        return Decision(reply.action)  # add or none: the other fields do not matter

    async def close(self) -> None:
        await self._endpoint.close()

    # --- one call ------------------------------------------------------------------

    def response_format_for(self, name: str, schema: dict[str, Any]) -> dict[str, Any]:
        if self.response_format == "json_object":
            return {"type": "json_object", "schema": schema}
        return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}

    async def _ask(
        self, system: str, prompt: str, name: str, schema: dict[str, Any], spent: list[Usage] | None = None
    ) -> str:
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
            "max_tokens": self.settings.max_tokens or self.MAX_TOKENS,
            "temperature": self.settings.temperature,
            "response_format": self.response_format_for(name, schema),
        }
        reply = await self._endpoint.post(body, what=name, base_s=RETRY_BASE_S, max_s=RETRY_MAX_S, logger=log)
        return self._content(reply, spent)

    def _content(self, reply: httpx.Response, spent: list[Usage] | None = None) -> str:
        raw = reply.text
        try:
            data = reply.json()
            choice = data["choices"][0]
            content = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise FactReplyInvalid("not a chat completion reply", raw) from None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        used = Usage(1, _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"))
        self.usage += used
        if spent is not None:
            spent.append(used)
        if not isinstance(content, str) or not content.strip():
            raise FactReplyInvalid("the reply has no content", raw)
        if choice.get("finish_reason") == "length":
            raise FactReplyInvalid(f"cut at max_tokens ({self.settings.max_tokens or self.MAX_TOKENS})", content)
        return content


def _count(usage: dict, key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and value >= 0 else 0
