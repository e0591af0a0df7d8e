"""What happens to a batch of JetStream messages when its work fails: the
retry, back-off, outage-wait and dead-letter policy, written once for every
kind that consumes the event log (persistence, indexing, a rebuild's replica).

A kind hands :meth:`BatchPolicy.run` its messages, its ``work`` (commit,
index) and what to do once it succeeded (``done``: ack, announce). Around
that, an ordered list of hooks, each with one job, after Dramatiq's
``Middleware``: every hook is called in order ``before`` the work, after it
(``after_work``, ``after_done``), ``on_failure`` and ``on_cancel``. On a
failure the hooks pass a :class:`Batch` along and fill in its ``verdict``:

- :class:`Classify` says what the failure is from the kind's declared rules
  (:class:`Outage`, :class:`Transient`, :class:`Poison`);
- :class:`AdjustRetry` lets the kind have the last word on a retry;
- :class:`Measure` records the metrics;
- :class:`BackOff` hands a retried batch back: at once when the dependency
  it waited on answers again, else after the delay;
- :class:`DeadLetterPoison` sends a poison message to ``MEMQ_DLQ`` with its
  typed reason, then acks it;
- :class:`NakOnCancel` hands a batch cut short by a stop back at once.

A failure no rule classifies is raised on, to the consumer (a bug: the batch
is redelivered after 5 s, never dropped). A :class:`Split` verdict runs each
message of the batch again on its own, so one bad message cannot hold the
others back. Nothing here acks what the work did not finish: a batch is
acked by ``done``, dead-lettered messages by :class:`DeadLetterPoison`, and
everything else is naked, so every guarantee of the stream (nothing lost,
exactly-once by event id, stream order per consumer) stays with the kind.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from nats.aio.msg import Msg

from memq.contracts.backoff import stepped
from memq.workers import metrics
from memq.workers.runtime.dead_letters import DeadLetters
from memq.workers.runtime.until_up import until_up

log = logging.getLogger("memq.batch")

T = TypeVar("T")
Check = Callable[[], Awaitable[bool]]  # is the dependency back? (may raise: still down)


# --- verdicts: what a failed batch becomes ----------------------------------------


@dataclass(frozen=True)
class Retry:
    """Hand the batch back for redelivery after ``delay`` seconds; with
    ``wait_for``, hold it until that check passes (at most ``delay``) and hand
    it back at once. ``delays`` is the schedule ``delay`` was taken from."""

    delay: float
    delays: Sequence[float]
    wait_for: Check | None = None


@dataclass(frozen=True)
class Split:
    """The batch was rejected as a whole: run each message on its own."""


@dataclass(frozen=True)
class DeadLetter:
    """The message cannot be processed: to ``MEMQ_DLQ`` with this code and reason."""

    code: str
    reason: str


Verdict = Retry | Split | DeadLetter


# --- the rules a kind declares -----------------------------------------------------


@dataclass(frozen=True)
class Outage:
    """A dependency is down: retry on ``delays``, holding the batch while
    ``check`` says it is still down. With ``confirm``, any of ``errors`` is
    an outage only if ``check`` fails now (the database answers: the batch
    is at fault, not the database). With ``check_first``, the batch after
    an outage asks ``check`` before its work: the work is costly (embedding)
    and would only fail again."""

    check: Check
    delays: Sequence[float]
    errors: tuple[type[BaseException], ...] = (Exception,)
    confirm: bool = False
    check_first: bool = False


@dataclass(frozen=True)
class Transient:
    """Failures that pass by themselves: redelivered after a delay from ``delays``."""

    errors: tuple[type[BaseException], ...]
    delays: Sequence[float]


@dataclass(frozen=True)
class Poison:
    """What is left is the messages' fault: a batch is split to find the
    culprit, and a message on its own is dead-lettered with ``code``."""

    code: str
    reason: Callable[[Exception], str]
    errors: tuple[type[BaseException], ...] = (Exception,)


Rule = Outage | Transient | Poison


class DependencyDown(Exception):
    """Raised before the work when a ``check_first`` outage is not over."""

    def __init__(self, rule: Outage):
        super().__init__("still down")
        self.rule = rule


def retry_delay(msgs: Sequence[Msg], delays: Sequence[float]) -> float:
    """The delay for this batch's next try: the schedule's entry for its most
    delivered message (JetStream counts the deliveries), the last one after."""
    attempt = max((m.metadata.num_delivered or 1) for m in msgs)
    return stepped(delays, attempt - 1)


# --- the batch and the hooks --------------------------------------------------------


@dataclass
class Batch:
    """One batch on its way through the hooks."""

    msgs: list[Msg]
    finished: list[int]  # stream sequences acked as done (dead letters included)
    alone: bool = False  # one message of a split batch
    verdict: Verdict | None = None
    started: float = field(default_factory=time.perf_counter)


class BatchHook:
    """A hook's say at each stage; each does nothing unless overridden."""

    async def before(self, batch: Batch) -> None:
        """Before the work; raising fails the batch like the work would."""

    def after_work(self, batch: Batch) -> None:
        """The work succeeded (before ``done``)."""

    async def after_done(self, batch: Batch) -> None:
        """``done`` succeeded: the batch is acked."""

    async def on_failure(self, batch: Batch, exc: Exception) -> None:
        """The work failed: read or set ``batch.verdict``."""

    async def on_cancel(self, batch: Batch) -> None:
        """The work was cancelled (stopping)."""


class Classify(BatchHook):
    """The verdict on a failure, from the first of ``rules`` that fits it."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = list(rules)
        self._down: Outage | None = None  # the last batch failed on this outage

    async def before(self, batch: Batch) -> None:
        down, self._down = self._down, None
        if down is not None and down.check_first and not await down.check():
            raise DependencyDown(down)

    async def on_failure(self, batch: Batch, exc: Exception) -> None:
        batch.verdict = await self.verdict(batch, exc)

    async def verdict(self, batch: Batch, exc: Exception) -> Verdict | None:
        for rule in self.rules:
            if isinstance(exc, DependencyDown):
                if rule is not exc.rule:
                    continue
            elif not isinstance(exc, rule.errors):
                continue
            if isinstance(rule, Outage):
                if rule.confirm and await _up(rule.check):
                    continue
                self._down = rule
                return Retry(retry_delay(batch.msgs, rule.delays), rule.delays, wait_for=rule.check)
            if isinstance(rule, Transient):
                return Retry(retry_delay(batch.msgs, rule.delays), rule.delays)
            if not batch.alone:
                log.warning("batch of %d rejected (%s); trying one by one", len(batch.msgs), rule.reason(exc))
                return Split()
            return DeadLetter(rule.code, rule.reason(exc))
        return None


class AdjustRetry(BatchHook):
    """The kind's last word on a retry (the indexing worker follows a switch
    to another index generation at once)."""

    def __init__(self, adjust: Callable[[Retry], Awaitable[Retry]]):
        self.adjust = adjust

    async def on_failure(self, batch: Batch, exc: Exception) -> None:
        if isinstance(batch.verdict, Retry):
            batch.verdict = await self.adjust(batch.verdict)


class Measure(BatchHook):
    """``memq_commit_seconds`` for the work, ``memq_events_processed_total`` for
    what was done (``ok``) and handed back (``retried``)."""

    def __init__(self, worker: str):
        self.worker = worker

    def after_work(self, batch: Batch) -> None:
        metrics.COMMIT_SECONDS.labels(self.worker).observe(time.perf_counter() - batch.started)

    async def after_done(self, batch: Batch) -> None:
        metrics.processed(self.worker, "ok", len(batch.msgs))

    async def on_failure(self, batch: Batch, exc: Exception) -> None:
        if isinstance(batch.verdict, Retry):
            metrics.processed(self.worker, "retried", len(batch.msgs))


class BackOff(BatchHook):
    """Hands a retried batch back. Waiting on an outage, it keeps the batch
    (and the consume loop's slot: fetching more would only fail again) and
    asks the dependency every half second, handing the batch back the
    moment it answers rather than after the whole delay (up to 30 s); not
    past half of ``ack_wait_s``, or JetStream redelivers it meanwhile.
    Otherwise the batch is naked with the delay and the loop held as long."""

    def __init__(self, failing: str, *, ack_wait_s: float = math.inf, prefix: str = ""):
        self.failing = failing  # what failed, for the log: "commit", "indexing"
        self.ack_wait_s = ack_wait_s  # the consumer's: bounds an outage wait
        self.prefix = prefix

    async def on_failure(self, batch: Batch, exc: Exception) -> None:
        retry = batch.verdict
        if not isinstance(retry, Retry):
            return
        why = f"{self.prefix}{self.failing} failed ({type(exc).__name__}: {exc})"
        if retry.wait_for is not None:
            log.warning("%s; redelivery within %.1fs", why, retry.delay)
            await until_up(retry.wait_for, within=min(retry.delay, self.ack_wait_s / 2))
            delay = 0.0
        else:
            log.warning("%s; redelivery in %.1fs", why, retry.delay)
            delay = retry.delay
        for msg in batch.msgs:
            await msg.nak(delay=delay)
        await asyncio.sleep(delay)


class DeadLetterPoison(BatchHook):
    """Sends a poison message to ``MEMQ_DLQ`` with its code and reason, then
    acks it. If the DLQ itself is unreachable the message is kept: naked,
    redelivered after ``retry_delay_s``."""

    def __init__(self, dlq: DeadLetters, *, retry_delay_s: float):
        self.dlq = dlq
        self.retry_delay_s = retry_delay_s

    async def on_failure(self, batch: Batch, exc: Exception) -> None:
        if isinstance(letter := batch.verdict, DeadLetter):
            for msg in batch.msgs:
                await self.send(msg, letter.code, letter.reason, batch.finished)

    async def send(self, msg: Msg, code: str, reason: str, finished: list[int]) -> None:
        """Dead-letter ``msg`` (also for a kind's own checks, such as decoding)."""
        seq = msg.metadata.sequence.stream
        try:
            await self.dlq.send(msg, code, reason)
        except Exception as exc:
            log.error("cannot dead-letter seq %s (%s); will retry", seq, exc)
            await msg.nak(delay=self.retry_delay_s)
            return
        await msg.ack()
        finished.append(seq)
        metrics.processed(self.dlq.worker, "dead_lettered")


class NakOnCancel(BatchHook):
    """A stop cut the batch short: hand it back now, not after ``ack_wait``."""

    async def on_cancel(self, batch: Batch) -> None:
        for msg in batch.msgs:
            try:
                await msg.nak()
            except Exception:  # disconnected: redelivered after ack_wait anyway
                break


# --- the policy ---------------------------------------------------------------------


class BatchPolicy:
    """A kind's hooks, in the order they are called."""

    def __init__(self, hooks: Sequence[BatchHook]):
        self.hooks = list(hooks)

    async def run(
        self,
        msgs: list[Msg],
        work: Callable[[list[Msg]], Awaitable[T]],
        done: Callable[[list[Msg], T], Awaitable[object]] | None = None,
        *,
        finished: list[int] | None = None,
        alone: bool = False,
    ) -> None:
        """``work`` on ``msgs``, then ``done`` (which acks them); on a failure,
        what the hooks decide. Raises what no rule classifies, and what
        ``done`` raises (what it acked is done; the rest is redelivered)."""
        batch = Batch(msgs, finished if finished is not None else [], alone=alone)
        try:
            for hook in self.hooks:
                await hook.before(batch)
            result = await work(msgs)
        except asyncio.CancelledError:
            for hook in self.hooks:
                await hook.on_cancel(batch)
            raise
        except Exception as exc:
            for hook in self.hooks:
                await hook.on_failure(batch, exc)
            if batch.verdict is None:
                raise
            if isinstance(batch.verdict, Split):
                for msg in msgs:
                    await self.run([msg], work, done, finished=batch.finished, alone=True)
            return
        for hook in self.hooks:
            hook.after_work(batch)
        if done is not None:
            await done(msgs, result)
        for hook in self.hooks:
            await hook.after_done(batch)

    async def dead_letter(self, msg: Msg, code: str, reason: str, finished: list[int]) -> None:
        """Dead-letter one message the kind found poison itself (undecodable)."""
        for hook in self.hooks:
            if isinstance(hook, DeadLetterPoison):
                await hook.send(msg, code, reason, finished)
                return
        raise LookupError("this policy has no DeadLetterPoison hook")


async def _up(check: Check) -> bool:
    try:
        return await check()
    except Exception:  # still down, whatever the way it fails
        return False
