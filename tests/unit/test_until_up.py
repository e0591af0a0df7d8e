"""until_up: back as soon as the check passes, not after the whole delay."""

from __future__ import annotations

import asyncio
import time

from memq.workers.runtime.until_up import until_up


def checks(results: list[bool | Exception]):
    calls = []

    async def check() -> bool:
        calls.append(time.monotonic())
        r = results[min(len(calls) - 1, len(results) - 1)]
        if isinstance(r, Exception):
            raise r
        return r

    return check, calls


async def test_returns_once_the_check_passes_long_before_the_delay():
    check, calls = checks([False, ConnectionRefusedError("down"), True])
    t0 = time.monotonic()
    assert await until_up(check, within=30, poll_s=0.05)
    assert len(calls) == 3
    assert time.monotonic() - t0 < 5  # three polls of 0.05 s; the 30 s are not slept out


async def test_false_after_within_when_never_up():
    check, calls = checks([False])
    t0 = time.monotonic()
    assert not await until_up(check, within=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - t0 < 5
    assert len(calls) >= 2


async def test_a_check_that_hangs_counts_as_down():
    async def hangs() -> bool:
        await asyncio.sleep(3600)
        return True

    assert not await until_up(hangs, within=0.2, poll_s=0.05, check_timeout_s=0.05)
