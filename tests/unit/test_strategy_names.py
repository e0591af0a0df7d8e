"""Where a strategy is named (settings, per-app overrides, requests, the CLI),
the default is budgeted and Hector's ``none`` means ``all``."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from memq.contracts import queries as q
from memq.workers import cli
from memq.workers.cli import reads as cli_reads
from memq.workers.memory.strategies import strategy_for
from memq.workers.settings import MemorySettings, Settings


def test_the_default_strategy_is_budgeted():
    assert MemorySettings().strategy == "summary_buffer"
    strategy = strategy_for(MemorySettings(), {}, None)
    assert (strategy.kind, strategy.budget, strategy.threshold, strategy.target, strategy.min_recent) == (
        "summary_buffer",
        8000,
        0.85,
        0.7,
        3,
    )


def test_none_means_all_in_settings_overrides_and_requests(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMQ_MEMORY__STRATEGY", "none")
    assert Settings(data_dir=tmp_path).memory.strategy == "all"
    assert MemorySettings(strategy="none").strategy == "all"
    assert strategy_for(MemorySettings(strategy="none"), {}, None).kind == "all"
    # per app, under either key
    assert strategy_for(MemorySettings(), {"strategy": "none", "budget": 10}, None).kind == "all"
    assert strategy_for(MemorySettings(), {"kind": "none"}, None).kind == "all"
    # per request: normalised on the way in, so replies and cache keys say "all"
    spec = q.StrategySpec(kind="none")
    assert spec.kind == "all" and spec == q.StrategySpec(kind="all")
    assert (
        q.HistoryGet.model_validate({"app": "a", "user": "u", "session": "s", "strategy": {"kind": "none"}}).strategy
        == spec
    )
    assert strategy_for(MemorySettings(), {}, spec).kind == "all"
    with pytest.raises(ValidationError):
        MemorySettings(strategy="fifo")
    with pytest.raises(ValidationError):
        q.StrategySpec(kind="fifo")


def test_the_context_command_takes_a_strategy(monkeypatch):
    asked = {}

    class FakeClient:
        async def context(self, user, session, **kw):
            asked.update(kw)
            return q.ContextView(
                format=kw["format"],
                tokens={"total": 500},
                messages=[],
                budget=120,
                over_budget=True,
                note="over budget: 500 tokens for a budget of 120 (strategy all keeps every event)",
            )

    monkeypatch.setattr(cli_reads, "_with_client", lambda app, work: asyncio.run(work(FakeClient())))
    out = CliRunner().invoke(
        cli.app,
        ["context", "-u", "u", "s", "--strategy", "none", "--budget", "120", "--format", "openai"],
        env={"COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    assert asked["strategy"] == {"kind": "none", "budget": 120}
    assert "over budget: 500 tokens for a budget of 120" in out.output
