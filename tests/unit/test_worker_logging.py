"""The workers' log handler writes tracebacks without syntax-highlighting
source files: a rich traceback lexes the whole file of every frame (3-4 s
for one SQLAlchemy error on a busy 2-core machine), and the worker's event
loop stood still meanwhile, during the very outage being logged."""

from __future__ import annotations

import io
import logging

from rich.console import Console
from rich.syntax import Syntax

from memq.workers.cli.common import log_handler


def test_a_logged_traceback_highlights_no_source(monkeypatch):
    highlighted = []
    original = Syntax.highlight
    monkeypatch.setattr(Syntax, "highlight", lambda self, *a, **k: highlighted.append(1) or original(self, *a, **k))
    handler = log_handler()
    handler.console = Console(file=(out := io.StringIO()), width=120)
    log = logging.getLogger("memq.test-logging")
    log.addHandler(handler)
    log.propagate = False
    try:
        try:
            raise ConnectionRefusedError("connect call failed")
        except ConnectionRefusedError:
            log.exception("commit failed")
    finally:
        log.removeHandler(handler)
    assert not highlighted
    text = out.getvalue()
    assert "commit failed" in text
    assert "Traceback (most recent call last)" in text and "ConnectionRefusedError: connect call failed" in text
