"""An instruction template, or any long text of its own, cannot let one tenant
stall the others (issue 38, finding 2), on the real multi-tenant stack
(tests/security/conftest.py).

A context's ``instruction`` is rendered from the caller's own state: a few KB
of ``{k}`` with a 20 KB ``k`` rendered hundreds of MB, which were tokenized on
the query worker's event loop before the answer was refused as too big to
send. The query worker now predicts the rendered size from the template and
the sizes of the values it substitutes, and refuses before building anything
(:func:`memq.workers.memory.template.rendered_size`); what it does render
and tokenize is bounded, and long texts are tokenized in a thread
(:mod:`memq.workers.offload`), as is a window counted again for the model a
request names.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest

from memq.contracts.errors import MemqError, Oversize
from memq.contracts.schemas import Event, Message, TextPart

from .conftest import A, B

VALUE = "all work and no play makes a dull tenant " * 500  # ~20 KB of ordinary words
USES = 5_000  # "{k}" 5,000 times: a 15 KB instruction that renders 100 MB
IDLE_READS = 200
ATTACK_S = 2.0  # A attacks for this long (at least once) while B reads


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> None:
    """Start VmHWM (peak RSS) afresh from the current RSS (Linux's clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _bound(idle: list[float]) -> float:
    """What B's p99 under attack may be. The issue's target is 2x B's idle
    p99. The workers, A and B share this process's one event loop on a
    loaded 2-core VM, where a single read can lose tens of ms to the
    scheduler whatever A does; 50 ms of slack still sits far below the
    stalls these tests guard against (seconds, and 100s of ms)."""
    return max(2 * _p99(idle), _p99(idle) + 0.05)


async def _reads(b, session: str, n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        await b.history("bob", session)
        took.append(time.perf_counter() - started)
    return took


async def _reads_while(b, session: str, attacking: asyncio.Task) -> tuple[list[float], list[MemqError]]:
    """B's reads, one after another, until ``attacking`` is done: their
    times, and the errors of those that failed (e.g. no answer in time)."""
    took, failed = [], []
    while not attacking.done():
        started = time.perf_counter()
        try:
            await b.history("bob", session)
        except MemqError as exc:
            failed.append(exc)
        took.append(time.perf_counter() - started)
    return took, failed


def _within(idle: list[float], attacked: list[float], failed: list[MemqError]) -> None:
    assert not failed, f"{len(failed)} of B's {len(attacked)} reads failed: {failed[0]}"
    bound = _bound(idle)
    assert len(attacked) >= 2 and _p99(attacked) <= bound, (
        f"B's reads under attack: p99 {_p99(attacked) * 1000:.0f} ms over {len(attacked)} reads, "
        f"max {max(attacked) * 1000:.0f} ms; idle p99 {_p99(idle) * 1000:.1f} ms, bound {bound * 1000:.0f} ms"
    )


async def test_an_amplifying_instruction_is_refused_before_it_is_built(tenants):
    a, b = await tenants.client(A), await tenants.client(B)
    try:
        said = Event(author="user", message=Message(role="user", parts=[TextPart(text="hello")]))
        await b.append("bob", "b-instr", said)
        await a.create_session("mallory", "a-instr", state={"k": VALUE})

        # A's own use of the template still works, the value substituted whole.
        view = await a.context("mallory", "a-instr", instruction="{k}")
        assert view.context is not None and view.context["instruction"] == VALUE

        idle = await _reads(b, "b-instr", IDLE_READS)

        # The query worker runs in this process (conftest), so this process's
        # peak RSS bounds the worker's: reset it, attack, read the new peak.
        _reset_peak_rss()
        rss_before = _status_kb("VmRSS")
        assert _status_kb("VmHWM") <= rss_before + 1024, "clear_refs did not reset the peak"

        template = "{k}" * USES
        attacks: list[float] = []
        errors: list[MemqError] = []

        async def attack() -> None:
            deadline = time.perf_counter() + ATTACK_S
            while not attacks or time.perf_counter() < deadline:
                started = time.perf_counter()
                with pytest.raises(MemqError) as err:  # which one is checked below
                    await a.context("mallory", "a-instr", instruction=template)
                attacks.append(time.perf_counter() - started)
                errors.append(err.value)

        attacking = asyncio.create_task(attack())
        attacked, failed = await _reads_while(b, "b-instr", attacking)
        await attacking
        peak_growth_mb = (_status_kb("VmHWM") - rss_before) / 1024
    finally:
        await a.close()
        await b.close()

    # A is told at once what it hit: the size the instruction would have had
    # and the limit, without the worker building it.
    size = USES * len(VALUE)
    assert isinstance(errors[0], Oversize), f"A got {errors[0]!r}, not oversize"
    message = errors[0].message
    assert f"would render to {size:,} characters, over the limit of " in message, message
    assert statistics.median(attacks) < 0.5, f"A's refusals took {statistics.median(attacks):.2f}s (median)"
    # Rendering it would hold 100 MB at least; the refusal needs none of it.
    assert peak_growth_mb < 64, f"the query worker's peak RSS grew {peak_growth_mb:.0f} MB"
    _within(idle, attacked, failed)


WORDS = "the quick brown fox jumps over a lazy dog while tenants share one loop " * 40  # ~2.8 KB
EVENTS = 1_200  # a 3.4 MB session


async def test_counting_a_window_for_another_model_does_not_stall_others(tenants):
    """A names a new model in each read of a long session of its own: each
    is a miss of every cache (the window's, the answer's) and counts the
    whole window again for that model, ~0.3 s of tiktoken; in a thread now."""
    # A's 3.4 MB session takes a slow machine more than the default 2 s to
    # commit (CI: 768 of 1,201 events), and A's first read waits for all of it.
    a, b = await tenants.client(A, wait_ms=30_000), await tenants.client(B)
    try:
        said = Event(author="user", message=Message(role="user", parts=[TextPart(text="hello")]))
        await b.append("bob", "b-model", said)
        turns = [
            Event(author="user", message=Message(role="user", parts=[TextPart(text=f"{i} {WORDS}")]))
            for i in range(EVENTS)
        ]
        await a.append_many("mallory", "a-model", turns)
        whole = await a.history("mallory", "a-model", strategy={"kind": "all"}, model="gpt-4-warm")
        assert len(whole.events) == EVENTS
        idle = await _reads(b, "b-model", IDLE_READS)

        asked = 0

        async def attack() -> None:
            nonlocal asked
            deadline = time.perf_counter() + ATTACK_S
            while not asked or time.perf_counter() < deadline:
                asked += 1
                view = await a.history("mallory", "a-model", strategy={"kind": "all"}, model=f"gpt-4-{asked}")
                assert len(view.events) == EVENTS

        attacking = asyncio.create_task(attack())
        attacked, failed = await _reads_while(b, "b-model", attacking)
        await attacking
    finally:
        await a.close()
        await b.close()
    assert asked >= 1
    _within(idle, attacked, failed)
