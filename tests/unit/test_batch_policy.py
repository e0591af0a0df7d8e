"""The batch policy's hooks in isolation, with fake messages, checks and a
fake DLQ: each hook's decision for a transient failure, a poison message and
a dependency outage, and what the policy then does with the messages."""

from __future__ import annotations

import asyncio
import time

import pytest
from fakes import FakeMsg

from memq.workers.metrics import REGISTRY
from memq.workers.runtime.batch_policy import (
    AdjustRetry,
    BackOff,
    Batch,
    BatchPolicy,
    Classify,
    DeadLetter,
    DeadLetterPoison,
    Measure,
    NakOnCancel,
    Outage,
    Poison,
    Retry,
    Split,
    Transient,
    retry_delay,
)

DELAYS = [0.2, 1.0, 5.0]


class Dlq:
    """Records what it is sent; raises while ``down``."""

    worker = "test"

    def __init__(self, down: bool = False):
        self.down = down
        self.sent: list[tuple[int, str, str]] = []

    async def send(self, msg: FakeMsg, code: str, reason: str) -> None:
        if self.down:
            raise ConnectionError("no DLQ")
        self.sent.append((msg.metadata.sequence.stream, code, reason))


class Dependency:
    """A dependency that is down for its first ``down`` checks."""

    def __init__(self, down: int):
        self.down = down
        self.checks = 0

    async def check(self) -> bool:
        self.checks += 1
        return self.checks > self.down


def batch(*msgs: FakeMsg, alone: bool = False) -> Batch:
    return Batch(list(msgs), [], alone=alone)  # type: ignore[arg-type]


def fails(exc: Exception):
    async def work(msgs: list) -> None:
        raise exc

    return work


# --- Classify: the verdict --------------------------------------------------------


def test_the_delay_follows_the_most_delivered_message_and_stays_at_the_last():
    assert retry_delay([FakeMsg(1, 1), FakeMsg(2, 2)], DELAYS) == 1.0  # type: ignore[arg-type]
    assert retry_delay([FakeMsg(1, 9)], DELAYS) == 5.0  # type: ignore[arg-type]


async def test_a_transient_failure_is_retried_after_its_own_schedule():
    sql = Transient((TimeoutError,), [0.1, 0.3])
    classify = Classify([Transient((ValueError,), DELAYS), sql])
    verdict = await classify.verdict(batch(FakeMsg(1, delivered=2)), TimeoutError("gone"))
    assert verdict == Retry(0.3, [0.1, 0.3])


async def test_an_error_no_rule_names_has_no_verdict():
    classify = Classify([Transient((ValueError,), DELAYS)])
    assert await classify.verdict(batch(FakeMsg(1)), KeyError("a bug")) is None


async def test_a_failure_while_the_dependency_is_down_is_an_outage_to_wait_out():
    db = Dependency(down=1)
    classify = Classify([Outage(db.check, DELAYS, confirm=True), Poison("storage_rejected", str)])
    verdict = await classify.verdict(batch(FakeMsg(1)), RuntimeError("refused"))
    assert isinstance(verdict, Retry) and verdict.wait_for == db.check and verdict.delay == 0.2


async def test_a_failure_while_the_dependency_answers_is_poison_split_then_dead_lettered():
    db = Dependency(down=0)
    classify = Classify([Outage(db.check, DELAYS, confirm=True), Poison("storage_rejected", lambda e: f"bad: {e}")])
    assert await classify.verdict(batch(FakeMsg(1), FakeMsg(2)), ValueError("x")) == Split()
    assert await classify.verdict(batch(FakeMsg(1), alone=True), ValueError("x")) == DeadLetter(
        "storage_rejected", "bad: x"
    )


async def test_after_an_outage_the_next_batch_asks_first_and_skips_its_work_while_still_down():
    index = Dependency(down=10)
    worked: list[int] = []

    async def work(msgs: list) -> None:
        worked.append(len(msgs))
        raise ConnectionError("index down")

    outage = Outage(index.check, [0.0], errors=(ConnectionError,), check_first=True)
    policy = BatchPolicy([Classify([outage]), BackOff("indexing", ack_wait_s=0.0)])
    await policy.run([FakeMsg(1)], work)  # type: ignore[list-item]
    assert worked == [1]
    second = FakeMsg(2)
    await policy.run([second], work)  # type: ignore[list-item]
    assert worked == [1]  # the costly work did not run again
    assert second.naks == [0.0]  # handed back all the same
    index.down = 0
    await policy.run([FakeMsg(3)], work)  # type: ignore[list-item]
    assert worked == [1, 1]  # back: the work runs


# --- BackOff: handing a retried batch back ---------------------------------------------


async def test_an_outage_hands_the_batch_back_as_soon_as_the_dependency_answers():
    db = Dependency(down=2)
    msgs = [FakeMsg(1), FakeMsg(2)]
    b = batch(*msgs)
    b.verdict = Retry(20.0, [20.0], wait_for=db.check)
    t0 = time.monotonic()
    await BackOff("commit", ack_wait_s=60.0).on_failure(b, RuntimeError("down"))
    assert db.checks == 3
    assert [m.naks for m in msgs] == [[0.0], [0.0]]
    assert time.monotonic() - t0 < 10


async def test_an_outage_is_not_waited_past_half_the_ack_wait():
    db = Dependency(down=1000)
    b = batch(FakeMsg(1))
    b.verdict = Retry(20.0, [20.0], wait_for=db.check)
    t0 = time.monotonic()
    await BackOff("commit", ack_wait_s=0.4).on_failure(b, RuntimeError("down"))
    assert time.monotonic() - t0 < 2


async def test_a_transient_failure_naks_with_its_delay_and_holds_the_loop_as_long():
    msg = FakeMsg(1)
    b = batch(msg)
    b.verdict = Retry(0.3, [0.3])
    t0 = time.monotonic()
    await BackOff("indexing").on_failure(b, OSError("embedder"))
    assert msg.naks == [0.3]
    assert time.monotonic() - t0 >= 0.29


async def test_the_kind_has_the_last_word_on_a_retry():
    async def at_once(retry: Retry) -> Retry:
        return Retry(0.0, retry.delays)

    msg = FakeMsg(1)
    policy = BatchPolicy([Classify([Transient((OSError,), [30.0])]), AdjustRetry(at_once), BackOff("indexing")])
    await policy.run([msg], fails(OSError("switched")))  # type: ignore[list-item]
    assert msg.naks == [0.0]


# --- DeadLetterPoison -------------------------------------------------------------------


async def test_poison_goes_to_the_dlq_with_its_reason_then_is_acked_and_finished():
    dlq, msg = Dlq(), FakeMsg(7)
    b = batch(msg, alone=True)
    b.verdict = DeadLetter("storage_rejected", "too long")
    await DeadLetterPoison(dlq, retry_delay_s=0.5).on_failure(b, ValueError())  # type: ignore[arg-type]
    assert dlq.sent == [(7, "storage_rejected", "too long")]
    assert (msg.acks, msg.naks, b.finished) == (1, [], [7])


async def test_poison_is_kept_when_the_dlq_is_unreachable():
    msg = FakeMsg(7)
    b = batch(msg, alone=True)
    b.verdict = DeadLetter("storage_rejected", "too long")
    await DeadLetterPoison(Dlq(down=True), retry_delay_s=0.5).on_failure(b, ValueError())  # type: ignore[arg-type]
    assert (msg.acks, msg.naks, b.finished) == (0, [0.5], [])


# --- the policy: the hooks together ------------------------------------------------------


def persistence_like(db: Dependency, dlq: Dlq) -> BatchPolicy:
    return BatchPolicy(
        [
            Classify([Outage(db.check, DELAYS, confirm=True), Poison("storage_rejected", str)]),
            Measure("test"),
            BackOff("commit", ack_wait_s=60.0),
            DeadLetterPoison(dlq, retry_delay_s=DELAYS[0]),  # type: ignore[arg-type]
        ]
    )


async def test_a_rejected_batch_is_split_and_only_the_culprit_is_dead_lettered():
    dlq = Dlq()
    msgs = [FakeMsg(1), FakeMsg(2), FakeMsg(3)]
    committed: list[int] = []

    async def commit(ms: list) -> list[int]:
        seqs = [m.metadata.sequence.stream for m in ms]
        if 2 in seqs:
            raise ValueError("value too long")
        return seqs

    async def done(ms: list, seqs: list[int]) -> None:
        committed.extend(seqs)
        for m in ms:
            await m.ack()

    finished: list[int] = []
    await persistence_like(Dependency(down=0), dlq).run(msgs, commit, done, finished=finished)  # type: ignore[arg-type]
    assert committed == [1, 3]  # in stream order
    assert dlq.sent == [(2, "storage_rejected", "value too long")]
    assert [m.acks for m in msgs] == [1, 1, 1]
    assert finished == [2]  # done() records what it finished itself


async def test_nothing_is_acked_or_dead_lettered_during_an_outage():
    dlq = Dlq()
    msgs = [FakeMsg(1), FakeMsg(2)]
    await persistence_like(Dependency(down=1), dlq).run(msgs, fails(ConnectionError("refused")))  # type: ignore[arg-type]
    assert dlq.sent == []
    assert [(m.acks, m.naks) for m in msgs] == [(0, [0.0]), (0, [0.0])]


async def test_the_metrics_count_what_was_done_and_what_was_handed_back():
    def count(outcome: str) -> float:
        return REGISTRY.get_sample_value("memq_events_processed_total", {"worker": "test", "outcome": outcome}) or 0.0

    ok, retried = count("ok"), count("retried")
    policy = persistence_like(Dependency(down=1), Dlq())

    async def commit(ms: list) -> None:
        return None

    await policy.run([FakeMsg(1), FakeMsg(2)], commit)  # type: ignore[list-item]
    await policy.run([FakeMsg(3)], fails(ConnectionError("refused")))  # type: ignore[list-item]
    assert (count("ok") - ok, count("retried") - retried) == (2, 1)


async def test_an_unclassified_failure_goes_to_the_consumer_untouched():
    msg = FakeMsg(1)
    policy = BatchPolicy([Classify([Transient((OSError,), DELAYS)]), BackOff("indexing"), NakOnCancel()])
    with pytest.raises(KeyError):
        await policy.run([msg], fails(KeyError("a bug")))  # type: ignore[list-item]
    assert msg.naks == []  # the consumer naks a bug's batch itself


async def test_a_batch_cut_short_by_a_stop_is_handed_back_at_once():
    msgs = [FakeMsg(1), FakeMsg(2)]

    async def slow(ms: list) -> None:
        await asyncio.sleep(30)

    policy = BatchPolicy([NakOnCancel()])
    task = asyncio.create_task(policy.run(msgs, slow))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [m.naks for m in msgs] == [[None], [None]]
