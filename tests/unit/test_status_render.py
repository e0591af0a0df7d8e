"""`memq status` reads at 80 columns and in a pipe (rich gives a pipe 80):
names and numbers are never wrapped, the HTTP gateway is listed with its URL."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from io import StringIO

from rich.console import Console

from memq.workers.status import ConsumerStatus, Instance, Status, StreamStatus, render

NOW = datetime(2026, 11, 27, 14, 5, tzinfo=UTC)
STATUS = Status(
    stream="MEMQ_EVENTS",
    last_seq=1234567,
    messages=1234567,
    consumers=[
        ConsumerStatus("memq-persistence", 0, 0, 0, 1234567),
        ConsumerStatus("memq-indexing", 123456, 256, 3, 1111111),
    ],
    instances=[
        Instance("memq-persistence", "AbCdEfGhIjKlMn00000001", "0.1.0", started="2026-11-27T13:02:11.123456789Z"),
        Instance("memq-summarizer", "AbCdEfGhIjKlMn00000002", "0.1.0", started="2026-11-25T14:05:00Z"),
        Instance(
            "memq-query",
            "AbCdEfGhIjKlMn00000003",
            "0.1.0",
            started="2026-11-27T14:04:58Z",
            requests=12345678,
            errors=12,
            avg_ms=123.45,
            last_error="timeout waiting for the commit floor of app support-bot (a long reason that must fold)",
        ),
        Instance(
            "memq-http",
            "AbCdEfGhIjKlMn00000004",
            "0.1.0",
            started="2026-11-27T14:00:00Z",
            metadata={"url": "http://127.0.0.1:8480"},
        ),
    ],
    dlq="MEMQ_DLQ",
    dlq_messages=0,
    dlq_by_subject={},
)


def rendered(width: int = 80) -> list[str]:
    out = StringIO()  # not a terminal: as in a pipe
    render(STATUS, Console(file=out, width=width), now=NOW)
    return out.getvalue().splitlines()


def test_every_line_fits_80_columns_and_no_name_is_wrapped():
    lines = rendered()
    assert max(len(line.rstrip()) for line in lines) <= 80, "\n".join(lines)
    rows = {line.split()[0]: line.split() for line in lines if line.strip()}
    assert rows["memq-persistence"] == ["memq-persistence", "0", "0", "0", "1234567"]
    assert rows["memq-indexing"] == ["memq-indexing", "123456", "256", "3", "1111111"]
    assert rows["persistence"][:3] == ["persistence", "00000001", "1h"]  # 1h 2m up
    assert rows["summarizer"][:4] == ["summarizer", "00000002", "2d", "0"]
    assert rows["query"][:8] == ["query", "00000003", "2s", "12345678", "12", "123.45", "timeout", "waiting"]


def test_the_http_gateway_is_listed_with_its_url():
    http = next(line for line in rendered() if line.split()[:1] == ["http"])
    assert "http://127.0.0.1:8480" in http


def test_a_wider_terminal_shows_the_same_rows():
    wide = [line.rstrip() for line in rendered(200) if line.strip()]
    assert any(line.split()[:1] == ["http"] and line.endswith("http://127.0.0.1:8480") for line in wide)


def test_each_app_stream_has_a_table_of_its_own():
    own = StreamStatus("MEMQ_EVENTS_support-bot", 2000100, 99, [ConsumerStatus("memq-persistence", 7, 0, 0, 2000093)])
    missing = StreamStatus("MEMQ_EVENTS_billing-agent", None, None, [])
    status = dataclasses.replace(STATUS, app_streams=[own, missing])
    out = StringIO()
    render(status, Console(file=out, width=80), now=NOW)
    text = out.getvalue()
    assert "MEMQ_EVENTS: last seq 1234567" in text
    assert "MEMQ_EVENTS_support-bot: last seq 2000100, 99 messages" in text
    assert "stream MEMQ_EVENTS_billing-agent does not exist yet" in text
    shown = status.to_dict()["app_streams"][0]["consumers"][0]
    assert (shown["name"], shown["backlog"]) == ("memq-persistence", 7)
