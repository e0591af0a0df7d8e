"""The `memq export` line format and the import's first pass: every bad line
is named by number and reason (workers/transfer/format.py, importer.check_file)."""

from __future__ import annotations

import orjson
import pytest

from memq.contracts import codec
from memq.contracts.schemas import Event, EventAppended, Message, SessionDeleted, TextPart
from memq.workers.transfer.format import (
    BadLine,
    Footer,
    Header,
    Record,
    footer_line,
    header_line,
    parse_line,
    record_line,
)
from memq.workers.transfer.importer import check_file

EVENT = EventAppended(
    app="a", user="u", session="s", event=Event(message=Message(role="user", parts=[TextPart(text="hi")]))
)


def test_lines_round_trip():
    header = parse_line(1, header_line(1.5, "sqlite", {"app": "a"}))
    assert isinstance(header, Header) and (header.created_at, header.source, header.filter) == (
        1.5,
        "sqlite",
        {"app": "a"},
    )
    record = parse_line(2, record_line(7, codec.encode(EVENT)))
    assert isinstance(record, Record) and (record.lineno, record.seq, record.message) == (2, 7, EVENT)
    assert parse_line(3, footer_line(1)) == Footer(3, 1)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"{oops", "not JSON"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (b'{"memq_export": 2}', "export format 2 is not supported"),
        (b'{"seq": 1}', "a record needs 'message'"),
        (b'{"seq": -1, "message": {}}', "'seq' must be a non-negative integer or null"),
        (b'{"seq": 1, "message": {"v": 1, "kind": "event"}}', "invalid message: app: Field required"),
        (
            orjson.dumps(
                {"seq": 1, "message": {**orjson.loads(codec.encode(EVENT)), "event": {"message": {"role": "x"}}}}
            ),
            "invalid message: event.message.role",
        ),
        (
            record_line(1, codec.encode(SessionDeleted(app="a", user="u", session="s"))),
            "a 'session.delete' message cannot be imported",
        ),
        (b'{"memq_export_end": 1, "records": "3"}', "the footer's 'records' must be an integer"),
    ],
)
def test_bad_lines_say_why(line: bytes, reason: str):
    with pytest.raises(BadLine) as caught:
        parse_line(9, line)
    assert caught.value.lineno == 9 and reason in caught.value.reason, caught.value.reason
    assert str(caught.value).startswith("line 9: ")


def _file(tmp_path, *lines: bytes):
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines))
    return path


def test_check_file_counts_records_and_finds_every_bad_line(tmp_path):
    good = record_line(1, codec.encode(EVENT))
    assert check_file(_file(tmp_path, header_line(0, "x", {}), good, b"", good, footer_line(2))).records == 2
    checked = check_file(
        _file(tmp_path, header_line(0, "x", {}), b"{", good, header_line(0, "x", {}), footer_line(1), good)
    )
    assert [(e.lineno, e.reason) for e in checked.errors] == [
        (2, checked.errors[0].reason),
        (4, "a second header"),
        (6, "a line after the footer"),
    ]
    assert checked.errors[0].reason.startswith("not JSON")


@pytest.mark.parametrize(
    ("lines", "lineno", "reason"),
    [
        ((), 1, "the file is empty"),
        ((b'{"hello": 1}',), 1, "the first line must be the export header"),
        ((header_line(0, "x", {}), record_line(1, codec.encode(EVENT))), 2, "no footer"),
        ((header_line(0, "x", {}), footer_line(3)), 2, "the footer counts 3 records, the file holds 0"),
    ],
)
def test_check_file_refuses_what_is_not_a_whole_export(tmp_path, lines, lineno, reason):
    checked = check_file(_file(tmp_path, *lines))
    assert checked.error_count == 1 and checked.errors[0].lineno == lineno and reason in checked.errors[0].reason
