"""The LLM summarizer against a real OpenAI-compatible server (llama.cpp with
Gemma 3 270M, the ``llama_server`` fixture), plus a scripted HTTP stub for the
replies a healthy local server never gives (500, 429, echoed keys, empty content).

The model is a base model: its summaries are not judged here, only the protocol,
the token target, timeouts, retries, failures and secrecy of the API key.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from contention import CpuContention
from fakes import ChatStub, completion
from pydantic import SecretStr
from services import LlamaServer

from memq.workers.memory.extractive import Turn
from memq.workers.memory.tokens import count_text
from memq.workers.settings import LLMSettings
from memq.workers.summarizer import llm
from memq.workers.summarizer.base import Summarizer, SummarizerError
from memq.workers.summarizer.llm import LLMSummarizer, fit

KEY = "sk-test-do-not-leak-5f1c2a"
DAY = 86_400
T0 = 1_683_504_000  # 2023-05-08 00:00 UTC

LINES = [
    ("Caroline", "Hi Mel! I went to the LGBTQ support group yesterday."),
    ("Melanie", "That's great, Caroline. How was it?"),
    ("Caroline", "Really moving. I met Jordan, who moved here from Denver in 2019."),
    ("Melanie", "I painted a sunrise over the lake last weekend."),
    ("Caroline", "I want to adopt a child. I decided to apply in June."),
    ("Melanie", "We are going camping with the kids on May 20."),
    ("Caroline", "I have 3 counseling sessions booked this month."),
    ("Melanie", "My daughter turns 7 on Friday."),
    ("Caroline", "I'll take the pottery class on Tuesdays at 6 pm."),
    ("Melanie", "The class costs 120 dollars for 8 weeks."),
]


def turns(n: int) -> list[Turn]:
    """``n`` short turns, one per day from 2023-05-08, cycling through LINES."""
    return [Turn(*LINES[i % len(LINES)], timestamp=T0 + i * DAY) for i in range(n)]


def settings_for(base_url: str, **kw) -> LLMSettings:
    # Greedy decoding: the base model's (meaningless) replies are the same every run.
    kw = {"model": LlamaServer.model, "temperature": 0.0, **kw}
    return LLMSettings(base_url=base_url, api_key=SecretStr(KEY), **kw)


def capture(summarizer: LLMSummarizer) -> list[dict]:
    """Record the JSON body of every request the summarizer sends."""
    sent: list[dict] = []

    async def hook(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    summarizer._endpoint.client.event_hooks["request"].append(hook)
    return sent


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(llm, "RETRY_BASE_S", 0.01)
    monkeypatch.setattr(llm, "RETRY_MAX_S", 0.05)


def retries_logged(caplog) -> int:
    return sum("retry" in r.getMessage() for r in caplog.records if r.name == "memq.summarizer.llm")


def assert_no_key(error: BaseException | str, caplog) -> None:
    assert KEY not in str(error)
    assert KEY not in caplog.text


# --- against the real server ----------------------------------------------------------


async def test_summary_of_twenty_turns_fits_the_target(llama_server):
    summarizer = LLMSummarizer(settings_for(llama_server.url))
    assert isinstance(summarizer, Summarizer)
    sent = capture(summarizer)
    try:
        summary = await summarizer.summarize(turns(20), previous="Caroline and Melanie are friends.", target_tokens=60)
    finally:
        await summarizer.close()
    assert isinstance(summary, str) and summary and summary == summary.strip()
    assert count_text(summary) <= 60
    (body,) = sent
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["max_tokens"] == 60 and body["model"] == LlamaServer.model
    prompt = body["messages"][1]["content"]
    assert "[2023-05-08] Caroline: Hi Mel! I went to the LGBTQ support group yesterday." in prompt
    assert "[2023-05-27] Melanie: The class costs 120 dollars for 8 weeks." in prompt  # the 20th turn
    assert "Caroline and Melanie are friends." in prompt and "at most 45 words" in prompt


async def test_summarizer_model_is_the_model_sent(llama_server):
    # The llama.cpp server serves its one model under any name and echoes the name it was sent.
    summarizer = LLMSummarizer(settings_for(llama_server.url, model="gpt-4o", summarizer_model="cheap-summarizer"))
    sent = capture(summarizer)
    echoed: list[str] = []

    async def on_reply(response: httpx.Response) -> None:
        echoed.append(json.loads(await response.aread())["model"])

    summarizer._endpoint.client.event_hooks["response"].append(on_reply)
    try:
        assert await summarizer.summarize(turns(4), previous=None, target_tokens=24)
    finally:
        await summarizer.close()
    assert summarizer.name == "llm:cheap-summarizer"
    assert [b["model"] for b in sent] == ["cheap-summarizer"] and echoed == ["cheap-summarizer"]


async def test_custom_prompt_and_max_tokens(llama_server):
    template = 'Notes so far: {previous_summary}\nChat:\n{conversation}\nJSON {"words": {target_words}}'
    summarizer = LLMSummarizer(settings_for(llama_server.url, prompt=template, max_tokens=12))
    sent = capture(summarizer)
    try:
        summary = await summarizer.summarize(turns(3), previous=None, target_tokens=40)
    finally:
        await summarizer.close()
    assert summary and count_text(summary) <= 40
    assert sent[0]["max_tokens"] == 12
    assert sent[0]["messages"][1]["content"].startswith("Notes so far: (none)\nChat:\n[2023-05-08] Caroline: Hi")
    assert sent[0]["messages"][1]["content"].endswith('JSON {"words": 30}')


async def test_a_timeout_too_small_fails_after_the_retries(llama_server, caplog):
    caplog.set_level(logging.WARNING)
    # max_tokens small: the server finishes a generation the client gave up on.
    summarizer = LLMSummarizer(settings_for(llama_server.url, timeout_s=0.05, retries=2, max_tokens=4))
    sent = capture(summarizer)
    started = time.monotonic()
    try:
        with (
            CpuContention() as cpu,
            pytest.raises(SummarizerError, match=r"failed 3 time\(s\), last: timeout") as error,
        ):
            await summarizer.summarize(turns(20), previous=None, target_tokens=100)
    finally:
        await summarizer.close()
    # Three tries of 0.05 s: well under 2 s on an idle machine, slower as
    # other work takes the CPU (3.5 s seen on a loaded CI runner).
    assert time.monotonic() - started < 2.0 * cpu.factor
    assert len(sent) == 3 and retries_logged(caplog) == 2
    assert_no_key(error.value, caplog)


async def test_a_prompt_over_the_context_fails_at_once(llama_server, caplog):
    # The real server answers 400 for a prompt longer than its n_ctx: not retried.
    caplog.set_level(logging.WARNING)
    summarizer = LLMSummarizer(settings_for(llama_server.url, retries=3))
    sent = capture(summarizer)
    try:
        with pytest.raises(SummarizerError, match="HTTP 400") as error:
            await summarizer.summarize(turns(400), previous=None, target_tokens=50)
    finally:
        await summarizer.close()
    assert len(sent) == 1 and retries_logged(caplog) == 0
    assert_no_key(error.value, caplog)


async def test_a_stopped_server_fails(llama_server):
    with LlamaServer() as server:  # its own: the session's one stays up for the other tests
        summarizer = LLMSummarizer(settings_for(server.url, retries=1))
        try:
            assert await summarizer.summarize(turns(2), previous=None, target_tokens=16)
            server.stop()
            started = time.monotonic()
            with pytest.raises(SummarizerError, match=r"failed 2 time\(s\), last: ConnectError") as error:
                await summarizer.summarize(turns(2), previous=None, target_tokens=16)
            assert time.monotonic() - started < 2.0
            assert KEY not in str(error.value)
        finally:
            await summarizer.close()


# --- a scripted stub for replies a healthy local server never gives -------------------------


@pytest.fixture
def stub() -> Iterator[Callable[[list], ChatStub]]:
    made: list[ChatStub] = []

    def make(script):
        made.append(ChatStub(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


async def test_retries_500_and_429_then_succeeds(stub, caplog):
    caplog.set_level(logging.WARNING)
    server = stub(
        [
            (500, {}, {"error": "boom"}),
            (429, {"Retry-After": "0"}, {"error": "slow down"}),
            (200, {}, completion("  Caroline plans to adopt in June.\n")),
        ]
    )
    summarizer = LLMSummarizer(settings_for(server.url, retries=2))
    try:
        summary = await summarizer.summarize(turns(3), previous=None, target_tokens=50)
    finally:
        await summarizer.close()
    assert summary == "Caroline plans to adopt in June."
    assert len(server.requests) == 3 and retries_logged(caplog) == 2
    assert server.requests[0][0]["Authorization"] == f"Bearer {KEY}"
    assert_no_key("", caplog)


async def test_other_4xx_fails_at_once_without_the_key(stub, caplog):
    caplog.set_level(logging.WARNING)
    server = stub([(401, {}, "ECHO")])
    summarizer = LLMSummarizer(settings_for(server.url, retries=3))
    try:
        with pytest.raises(SummarizerError, match="HTTP 401") as error:
            await summarizer.summarize(turns(2), previous=None, target_tokens=50)
    finally:
        await summarizer.close()
    assert len(server.requests) == 1 and "***" in str(error.value)
    assert_no_key(error.value, caplog)


@pytest.mark.parametrize("reply", [completion(""), completion("  \n "), completion(None), {"choices": []}, ["x"]])
async def test_empty_or_missing_content_fails(stub, reply):
    server = stub([(200, {}, reply)])
    summarizer = LLMSummarizer(settings_for(server.url))
    try:
        with pytest.raises(SummarizerError):
            await summarizer.summarize(turns(2), previous=None, target_tokens=50)
    finally:
        await summarizer.close()


async def test_a_rambling_reply_is_cut_to_the_target(stub):
    ramble = " ".join(f"Caroline said thing number {i} about the adoption plans." for i in range(200))
    server = stub([(200, {}, completion(ramble))])
    summarizer = LLMSummarizer(settings_for(server.url))
    try:
        summary = await summarizer.summarize(turns(2), previous=None, target_tokens=50)
    finally:
        await summarizer.close()
    assert 40 <= count_text(summary) <= 50 and summary.endswith("adoption plans.")


def test_fit_cuts_at_sentences_else_words():
    assert fit("Short. Text.", 10) == "Short. Text."
    assert fit("One two. " + "word " * 100, 20).endswith("…")  # a sentence cut would keep too little
    assert count_text(fit("One two. " + "word " * 100, 20)) <= 20
    assert fit("First sentence here. Second sentence is a bit longer.", 8) == "First sentence here."
    assert fit("x" * 400, 5) == ""
