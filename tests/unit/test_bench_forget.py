"""tests/bench/forget.py keeps its stack's data in a temporary folder that it
removes when it ends, a failed run too: it used to leave one in /tmp a run."""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path

import adapter_stack
import pytest
import run_bench


def test_the_forget_benchmark_removes_its_data_folder(monkeypatch):
    given: list[Path] = []

    @asynccontextmanager
    async def stack_that_fails(data_dir: Path):
        given.append(data_dir)
        assert data_dir.is_dir()
        raise RuntimeError("no stack in a unit test")
        yield ""  # an async generator, as the real one is

    monkeypatch.setattr(adapter_stack, "memq_stack", stack_that_fails)
    monkeypatch.setattr(sys, "argv", sys.argv)  # the runner sets the benchmark's
    monkeypatch.setattr("bench.benchlib.cpu_busy", lambda seconds=1.0: 0.0)  # no second of sampling
    with pytest.raises(RuntimeError, match="no stack"):
        run_bench.main(["forget", "--n", "1"])
    assert len(given) == 1 and not given[0].exists()
