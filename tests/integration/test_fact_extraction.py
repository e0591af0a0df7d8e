"""Fact extraction against a real OpenAI-compatible server: llama-cpp-python's
with Gemma 3 270M (the ``llama_server`` fixture), and the scripted stub of
``fakes.py`` for a malformed reply. The model is tiny and a base model: the
mechanics are asserted (the schema is honoured, the sources are turns that
were given), not the quality of its facts.

llama-cpp-python's server refuses ``response_format: {"type": "json_schema"}``
(HTTP 500, a validation error: it knows only ``text`` and ``json_object``);
it takes the schema as ``{"type": "json_object", "schema": ...}`` and
constrains its output with a grammar made from it.
"""

from __future__ import annotations

import pytest
from fakes import ChatStub, completion
from pydantic import SecretStr
from services import LlamaServer

from memq.workers.facts import extract
from memq.workers.facts.extract import FactLLM, FactLLMError, Said
from memq.workers.facts.llm_replies import FactReplyInvalid
from memq.workers.memory.extractive import Turn
from memq.workers.memory.facts import Candidate, Decision, Source, replay
from memq.workers.settings import LLMSettings

T0 = 1_683_504_000  # 2023-05-08 00:00 UTC
LINES = [
    ("user", "Hi! I'm Caroline. I moved to Denver in May and I work as a nurse."),
    ("assistant", "Welcome to Denver, Caroline! How is the new job?"),
    ("user", "Great. I also adopted a dog called Rex."),
]
TURNS = [Said(Source(10 + i, "s1", f"e{i}", T0 + 60 * i), Turn(a, t, T0 + 60 * i)) for i, (a, t) in enumerate(LINES)]


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(extract, "RETRY_BASE_S", 0.01)
    monkeypatch.setattr(extract, "RETRY_MAX_S", 0.05)


def settings_for(url: str, **kw) -> LLMSettings:
    # Greedy decoding: the same reply every run.
    kw = {"model": LlamaServer.model, "temperature": 0.0, "max_tokens": 200, "retries": 0, **kw}
    return LLMSettings(base_url=url, api_key=SecretStr("sk-local"), **kw)


async def test_a_conversation_yields_facts_citing_its_turns(llama_server):
    llm = FactLLM(settings_for(llama_server.url), response_format="json_object")
    try:
        candidates = await llm.extract("a", "caroline", TURNS)
    finally:
        await llm.close()
    given = {t.source for t in TURNS}
    assert candidates, "the model extracted nothing"
    for c in candidates:
        assert isinstance(c, Candidate) and (c.app, c.user) == ("a", "caroline")
        assert c.statement.strip() and c.sources and set(c.sources) <= given
    assert llm.usage.calls == 1 and llm.usage.prompt_tokens > 0 and llm.usage.completion_tokens > 0
    # and they reconcile: added, every one with its sources
    facts, log = replay((c, Decision("add")) for c in candidates)
    assert facts and all(f.sources and set(f.sources) <= given for f in facts.values())


async def test_a_decision_against_the_real_model_is_well_formed(llama_server):
    llm = FactLLM(settings_for(llama_server.url, max_tokens=60), response_format="json_object")
    old = Candidate("a", "caroline", "Caroline lives in Boston.", ("Boston",), (Source(1, "s0", "e0", T0 - 86_400),))
    facts, _ = replay([(old, Decision("add"))])
    new = Candidate("a", "caroline", "Caroline lives in Denver.", ("Denver",), (TURNS[0].source,))
    try:
        decision = await llm.decide(new, list(facts.values()))
    finally:
        await llm.close()
    assert decision.action in ("add", "merge", "invalidate", "none")
    assert set(decision.invalidates) | {decision.merge_into} - {None} <= set(facts)
    replay([(new, decision)], facts)  # whatever it chose applies


async def test_llama_cpp_python_refuses_json_schema(llama_server):
    # Why the tests send json_object: this server answers json_schema with a 500.
    llm = FactLLM(settings_for(llama_server.url), response_format="json_schema")
    try:
        with pytest.raises(FactLLMError, match="HTTP 500"):
            await llm.extract("a", "caroline", TURNS[:1])
    finally:
        await llm.close()


async def test_a_malformed_reply_raises_with_its_reason():
    stub = ChatStub(
        [
            (
                200,
                {},
                completion('{"facts": [{"statement": "Caroline is a nurse.", "entities": [], "sources": ["t7"]}]}'),
            ),
            (200, {}, completion("Sure! Caroline is a nurse.")),
        ]
    )
    llm = FactLLM(settings_for(stub.url), response_format="json_object")
    try:
        with pytest.raises(FactReplyInvalid) as unknown:
            await llm.extract("a", "caroline", TURNS)
        with pytest.raises(FactReplyInvalid) as prose:
            await llm.extract("a", "caroline", TURNS)
    finally:
        await llm.close()
        stub.close()
    assert unknown.value.reason == "unknown turn label 't7'" and '"t7"' in unknown.value.raw
    assert prose.value.reason.startswith("not JSON") and prose.value.raw == "Sure! Caroline is a nurse."
    assert len(stub.requests) == 2
