"""The LLM side of fact extraction (workers/facts): the requests sent, the
schema derived from the reply models, and every way a reply can be refused,
answered from a script by httpx.MockTransport (no server)."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import SecretStr

from memq.workers.facts import extract
from memq.workers.facts.extract import FactLLM, FactLLMError, Said, Usage
from memq.workers.facts.llm_replies import RAW_CHARS, DecisionReply, Extraction, FactReplyInvalid, sent_schema
from memq.workers.memory.extractive import Turn
from memq.workers.memory.facts import Candidate, Decision, Fact, Source
from memq.workers.settings import LLMSettings

KEY = "sk-test-facts-4e1d"
T0 = 1_683_504_000  # 2023-05-08 00:00 UTC
TURNS = [
    Said(Source(11, "s", "e11", T0), Turn("user", "I moved to Denver last month.", T0)),
    Said(Source(12, "s", "e12", T0 + 60), Turn("assistant", "How do you like it?", T0 + 60)),
    Said(Source(13, "s", "e13", T0 + 120), Turn("user", "Love it. My dog Rex too.", T0 + 120)),
]


def chat(content, finish_reason: str = "stop", usage: dict | None = None) -> dict:
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
        "usage": usage or {"prompt_tokens": 90, "completion_tokens": 30},
    }


class Script:
    """Answers each request with the next reply; keeps the requests."""

    def __init__(self, *replies: tuple[int, object]):
        self.replies = list(replies)
        self.sent: list[dict] = []
        self.headers: list[httpx.Headers] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(json.loads(request.content))
        self.headers.append(request.headers)
        status, body = self.replies.pop(0)
        return httpx.Response(status, json=body)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(extract, "RETRY_BASE_S", 0.001)
    monkeypatch.setattr(extract, "RETRY_MAX_S", 0.002)


def llm(script: Script, **kw) -> FactLLM:
    settings = LLMSettings(base_url="http://llm.test/v1", api_key=SecretStr(KEY), model="m", retries=1)
    return FactLLM(settings, transport=httpx.MockTransport(script), **kw)


async def test_extract_sends_labelled_turns_and_a_schema_and_maps_sources_back():
    reply = {"facts": [{"statement": " The user lives in  Denver. ", "entities": ["Denver"], "sources": ["t1", "t3"]}]}
    script = Script((200, chat(json.dumps(reply))))
    facts = llm(script)
    (candidate,) = await facts.extract("a", "u", TURNS)
    await facts.close()
    assert candidate == Candidate(
        app="a",
        user="u",
        statement="The user lives in Denver.",
        entities=("Denver",),
        sources=(TURNS[0].source, TURNS[2].source),
    )
    assert facts.usage == Usage(calls=1, prompt_tokens=90, completion_tokens=30)
    (body,) = script.sent
    assert script.headers[0]["authorization"] == f"Bearer {KEY}"
    assert [m["role"] for m in body["messages"]] == ["system", "user"] and body["model"] == "m"
    prompt = body["messages"][1]["content"]
    assert "[t1] [2023-05-08] user: I moved to Denver last month.\n[t2] [2023-05-08] assistant: How do you" in prompt
    assert "(sources)" in prompt
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "facts" and fmt["json_schema"]["strict"]
    item = fmt["json_schema"]["schema"]["properties"]["facts"]["items"]
    assert item["properties"]["sources"]["items"] == {"type": "string", "enum": ["t1", "t2", "t3"]}
    assert item["required"] == ["statement", "entities", "sources"] and item["additionalProperties"] is False


async def test_json_object_sends_the_schema_beside_the_type():
    script = Script((200, chat('{"facts": []}')))
    facts = llm(script, response_format="json_object")
    assert await facts.extract("a", "u", TURNS) == []
    await facts.close()
    fmt = script.sent[0]["response_format"]
    assert fmt["type"] == "json_object" and fmt["schema"]["required"] == ["facts"]


def test_the_sent_schema_is_the_models_closed_and_narrowed():
    schema = sent_schema(DecisionReply, {"merge_into": ["f1", "f2"], "invalidates": ["f1", "f2"]})
    assert "$defs" not in json.dumps(schema) and "title" not in json.dumps(schema)
    props = schema["properties"]
    assert props["action"]["enum"] == ["add", "merge", "invalidate", "none"]
    assert {"type": "string", "enum": ["f1", "f2"]} in props["merge_into"]["anyOf"]
    assert {"type": "null"} in props["merge_into"]["anyOf"]
    assert props["invalidates"]["items"]["enum"] == ["f1", "f2"]
    assert set(sent_schema(Extraction, {})["properties"]) == {"facts"}


async def test_no_turns_no_call():
    script = Script()
    facts = llm(script)
    assert await facts.extract("a", "u", []) == []
    assert await facts.decide(Candidate("a", "u", "x y", (), (TURNS[0].source,)), []) == Decision("add")
    await facts.close()
    assert script.sent == []


def fact(n: int, statement: str) -> Fact:
    return Fact(f"id{n}", "a", "u", statement, (), (TURNS[0].source,), T0)


@pytest.mark.parametrize(
    ("reply", "decision"),
    [
        ({"action": "add", "merge_into": None, "invalidates": []}, Decision("add")),
        ({"action": "none", "merge_into": "f2", "invalidates": ["f1"]}, Decision("none")),
        ({"action": "merge", "merge_into": "f2", "invalidates": []}, Decision("merge", "id2")),
        (
            {"action": "invalidate", "merge_into": None, "invalidates": ["f1", "f2"]},
            Decision("invalidate", None, ("id1", "id2")),
        ),
    ],
)
async def test_decide_maps_labels_to_fact_ids(reply, decision):
    script = Script((200, chat(json.dumps(reply))))
    facts = llm(script)
    candidate = Candidate("a", "u", "The user lives in Denver.", (), (TURNS[0].source,))
    assert (
        await facts.decide(candidate, [fact(1, "The user lives in Boston."), fact(2, "The user has a dog.")])
        == decision
    )
    await facts.close()
    prompt = script.sent[0]["messages"][1]["content"]
    assert "[f1] The user lives in Boston.\n[f2] The user has a dog." in prompt
    assert "New fact: The user lives in Denver." in prompt


BAD_EXTRACTIONS = [
    ("not json at all", "not JSON"),
    ('{"facts": [', "not JSON"),
    ("[]", "the reply: Input should be"),
    ('{"facts": "none"}', "facts: Input should be a valid list"),
    ('{"facts": [{"statement": "  ", "entities": [], "sources": ["t1"]}]}', "the statement is empty"),
    ('{"facts": [{"statement": "x", "entities": [], "sources": []}]}', "facts.0.sources"),
    ('{"facts": [{"statement": "x", "entities": [], "sources": ["t9"]}]}', "unknown turn label 't9'"),
    ('{"facts": [{"statement": "x", "entities": [1], "sources": ["t1"]}]}', "facts.0.entities.0"),
    ('{"facts": [{"statement": "x", "sources": ["t1"]}]}', "facts.0.entities: Field required"),
    ('{"facts": [], "notes": "hi"}', "notes: Extra inputs"),
]


@pytest.mark.parametrize(("content", "reason"), BAD_EXTRACTIONS)
async def test_a_bad_extraction_reply_is_invalid_with_its_reason(content, reason):
    facts = llm(Script((200, chat(content))))
    with pytest.raises(FactReplyInvalid, match="invalid fact reply") as error:
        await facts.extract("a", "u", TURNS)
    await facts.close()
    assert reason in error.value.reason and error.value.raw == content


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"action": "update", "merge_into": null, "invalidates": []}', "action: Input should be"),
        ('{"action": "merge", "merge_into": null, "invalidates": []}', "a merge without merge_into"),
        ('{"action": "merge", "merge_into": "f7", "invalidates": []}', "unknown fact label 'f7'"),
        ('{"action": "invalidate", "merge_into": null, "invalidates": []}', "an invalidation naming no fact"),
        ('{"action": "invalidate", "merge_into": null, "invalidates": ["f1", "x"]}', "unknown fact label 'x'"),
    ],
)
async def test_a_bad_decision_reply_is_invalid_with_its_reason(content, reason):
    facts = llm(Script((200, chat(content))))
    candidate = Candidate("a", "u", "The user lives in Denver.", (), (TURNS[0].source,))
    with pytest.raises(FactReplyInvalid) as error:
        await facts.decide(candidate, [fact(1, "The user lives in Boston.")])
    await facts.close()
    assert reason in error.value.reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"choices": []}, "not a chat completion reply"),
        (chat(None), "the reply has no content"),
        (chat("  "), "the reply has no content"),
        (chat('{"facts": [{"statement": "The us', finish_reason="length"), "cut at max_tokens (512)"),
    ],
)
async def test_replies_without_usable_content_are_invalid(body, reason):
    facts = llm(Script((200, body)))
    with pytest.raises(FactReplyInvalid) as error:
        await facts.extract("a", "u", TURNS)
    await facts.close()
    assert error.value.reason == reason


async def test_the_raw_reply_is_cut():
    content = "x" * (RAW_CHARS * 3)
    facts = llm(Script((200, chat(content))))
    with pytest.raises(FactReplyInvalid) as error:
        await facts.extract("a", "u", TURNS)
    await facts.close()
    assert len(error.value.raw) == RAW_CHARS


async def test_endpoint_errors_are_retried_then_raised_without_the_key():
    script = Script((503, {"error": "busy"}), (200, chat('{"facts": []}')))
    facts = llm(script)
    assert await facts.extract("a", "u", TURNS) == []
    await facts.close()
    assert len(script.sent) == 2
    script = Script((401, {"error": f"bad key {KEY}"}))
    facts = llm(script)
    with pytest.raises(FactLLMError, match="HTTP 401") as error:
        await facts.extract("a", "u", TURNS)
    await facts.close()
    assert KEY not in str(error.value) and len(script.sent) == 1
