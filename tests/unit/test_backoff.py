"""The retry delays memq waits (memq.contracts.backoff), pinned where each is
used: the client's publish retries, the HTTP clients of OpenAI-compatible
endpoints, the workers' batch redelivery and the Weaviate backend's
reconnects. The figures are what each produced before they shared one module
(computed from that code at 6224f3b, with the same seeds): a change to a
schedule shows here first."""

from __future__ import annotations

import asyncio
import math
import random
from types import SimpleNamespace

import nats.errors
import pytest
from fakes import FakeMsg, FakeNats
from nats.js.api import PubAck

from memq.contracts.client import MemoryClient
from memq.workers import http_retry
from memq.workers.index.backends import weaviate as weaviate_backend
from memq.workers.index.backends.base import IndexUnavailable
from memq.workers.runtime.batch_policy import retry_delay
from memq.workers.settings import Settings, WeaviateSettings

DEFAULT_DELAYS = Settings().indexing.retry_delays_s  # [0.5, 1, 2, 5, 10, 30], persistence's too


# --- pinned where used ---------------------------------------------------------------


class TimesOut:
    """JetStream that answers no publish for its first ``lost`` tries."""

    def __init__(self, lost: int):
        self.lost = lost
        self.waits: list[float | None] = []

    async def publish(self, subject, payload, timeout=None, stream=None, headers=None):
        self.waits.append(timeout)
        if len(self.waits) <= self.lost:
            raise nats.errors.TimeoutError
        return PubAck(stream="MEMQ_EVENTS", seq=1)


async def test_the_client_retries_a_publish_doubling_from_50_ms_to_1_s_with_equal_jitter(monkeypatch):
    drawn: list[tuple[float, float]] = []
    slept: list[float] = []
    uniform, sleep = random.uniform, asyncio.sleep

    def recorded_uniform(a: float, b: float) -> float:
        drawn.append((a, b))
        return uniform(a, b)

    async def recorded_sleep(seconds: float, *args: object) -> None:
        slept.append(seconds)
        await sleep(0)

    monkeypatch.setattr(random, "uniform", recorded_uniform)
    monkeypatch.setattr(asyncio, "sleep", recorded_sleep)
    js = TimesOut(lost=7)
    client = MemoryClient(FakeNats(js), "app", timeout=0.2, publish_deadline=30.0)  # type: ignore[arg-type]
    random.seed(44)
    assert await client._settle([("memq.v1.ev.a", b"{}", {"Nats-Msg-Id": "id-1"})]) == [1]
    delays = [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert drawn == [(d / 2, d) for d in delays]
    assert slept == [
        0.035213396981362347,
        0.07709860045522982,
        0.18620366164792734,
        0.23533312883908877,
        0.4900638082312587,
        0.5145486266340555,
        0.5583252667214319,
    ]
    # and each try after one that got no answer waits twice as long for its ack
    assert js.waits == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6]


@pytest.mark.parametrize(
    ("base_s", "max_s", "expected"),
    [
        (  # the embedders' (index/embedders/openai.py)
            0.5,
            20.0,
            [
                0.4702551724989429,
                0.8653595931552376,
                1.6660367243141352,
                4.827666869545426,
                8.311756101143729,
                17.52106125852214,
                20.0,
                20.0,
            ],
        ),
        (  # the summarizer's (summarizer/llm.py)
            1.0,
            30.0,
            [
                0.9405103449978858,
                1.7307191863104752,
                3.3320734486282704,
                9.655333739090851,
                16.623512202287458,
                30.0,
                30.0,
                30.0,
            ],
        ),
    ],
)
def test_the_http_clients_double_within_a_quarter_either_way_capped_after(base_s, max_s, expected):
    random.seed(41)
    assert [http_retry.delay(attempt, base_s, max_s) for attempt in range(8)] == expected


def test_the_http_clients_take_the_servers_retry_after_within_the_cap():
    state = random.getstate()
    assert http_retry.delay(0, 0.5, 20.0, server_says=3.0) == 3.0
    assert http_retry.delay(5, 0.5, 20.0, server_says=-1.0) == 0.0
    assert http_retry.delay(0, 0.5, 20.0, server_says=90.0) == 20.0
    assert random.getstate() == state  # no jitter drawn


def test_a_batch_is_redelivered_on_its_schedule_by_its_most_delivered_message():
    assert [retry_delay([FakeMsg(delivered=n)], DEFAULT_DELAYS) for n in range(1, 9)] == [  # type: ignore[list-item]
        0.5,
        1,
        2,
        5,
        10,
        30,
        30,
        30,
    ]
    assert retry_delay([FakeMsg(delivered=0)], DEFAULT_DELAYS) == 0.5  # type: ignore[list-item]  # none counted yet
    assert retry_delay([FakeMsg(1, 1), FakeMsg(2, 3)], [0.2, 1.0, 5.0]) == 5.0  # type: ignore[list-item]


async def test_weaviate_reconnects_after_200_ms_500_ms_then_every_second(monkeypatch):
    index = weaviate_backend.WeaviateIndex(WeaviateSettings(url="http://127.0.0.1:9"))
    clock = [0.0]
    monkeypatch.setattr(weaviate_backend, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    async def refused() -> None:
        raise IndexUnavailable("connection refused")

    monkeypatch.setattr(index, "_connect", refused)
    waits = []
    for attempt in range(5):
        clock[0] = 100.0 * (attempt + 1)  # past the last attempt's wait
        with pytest.raises(IndexUnavailable, match="connection refused"):
            await index._ready()
        waits.append(round(index._next_attempt - clock[0], 9))
    assert waits == [0.2, 0.5, 1.0, 1.0, 1.0]


# --- the module ------------------------------------------------------------------------


def test_a_schedule_repeats_its_last_delay():
    from memq.contracts.backoff import stepped

    assert [stepped([0.2, 0.5, 1.0], n) for n in range(5)] == [0.2, 0.5, 1.0, 1.0, 1.0]


def test_doubling_stops_at_its_cap_and_has_none_by_default():
    from memq.contracts.backoff import doubling

    assert [doubling(n, 0.05, 1.0) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert doubling(10, 0.5) == 512.0 and doubling(0, 2.0, math.inf) == 2.0


def test_the_jitters_stay_within_their_bounds():
    from memq.contracts.backoff import equal_jitter, spread

    random.seed(3)
    for _ in range(1000):
        assert 0.5 <= equal_jitter(1.0) <= 1.0
        assert 0.75 <= spread(2.0, 0.25) / 2.0 <= 1.25
