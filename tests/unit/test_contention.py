"""The contention factor that scales the suites' time bounds."""

from __future__ import annotations

import time

from contention import MAX_FACTOR, CpuContention, factor_of


def test_factor_is_runnable_tasks_per_core_within_bounds():
    assert factor_of([], 2) == 1.0
    assert factor_of([1, 1, 2], 2) == 1.0  # an idle machine: never below 1
    assert factor_of([6, 8, 10], 2) == 4.0
    assert factor_of([500], 2) == MAX_FACTOR


def test_the_sampler_sees_this_process_running():
    with CpuContention(every_s=0.01) as cpu:
        end = time.monotonic() + 0.2
        while time.monotonic() < end:  # busy: this thread is runnable when sampled
            pass
    assert cpu.samples and min(cpu.samples) >= 1
    assert 1.0 <= cpu.factor <= MAX_FACTOR
