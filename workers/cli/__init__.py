"""The `memq` command: a thin layer over the library (typer + rich).

One typer app (:mod:`.common`); each module adds its commands to it:
:mod:`.run` (up, worker, init, demo, config), :mod:`.reads` (sessions,
history, context, search), :mod:`.facts` (facts), :mod:`.forget` (one event), :mod:`.operate` (index,
status, dlq), :mod:`.transfer` (export, import),
:mod:`.accounts` (nats accounts), :mod:`.asyncapi` (the AsyncAPI document)
and :mod:`.mcp` (the MCP server).
"""

import importlib

from memq.workers.cli.common import app

# Imported in this order, which is the order of `memq --help` (an import
# sorter would reorder plain import lines).
for _module in ("run", "reads", "facts", "forget", "operate", "transfer", "accounts", "asyncapi", "mcp"):
    importlib.import_module(f"{__name__}.{_module}")

from memq.workers.cli.run import WorkerKind  # noqa: E402 (after the commands are registered)

__all__ = ["WorkerKind", "app"]
