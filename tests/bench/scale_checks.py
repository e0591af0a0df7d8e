"""The exactly-once checks of ``scale.py``, as pure functions over what was
read from the stream, SQL and the index (no I/O here).

Everything is cut at one stream sequence (``upto``): messages after it (a
late summary) are left out of every side alike.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    found: str
    ok: bool


@dataclass(frozen=True)
class Snapshot:
    """What the run left behind, up to stream sequence ``upto``.

    ``acked``: event id -> the seq its PubAck returned, for every event the
    load generator had acknowledged. ``stream_events`` / ``sql_events``:
    (event id, seq) per message or row. ``expected_docs``: the uuid of every
    doc the indexer should have written (``doc_for`` over the stream);
    ``index_docs``: the uuids the index holds, one entry per object it
    returned, and ``index_count`` what the index says it holds.
    ``stream_checkpoints``: checkpoint ids per message; ``sql_checkpoints``:
    (session key, checkpoint id, seq, up_to_seq) per row.
    """

    upto: int
    acked: dict[str, int]
    stream_events: list[tuple[str, int]]
    sql_events: list[tuple[str, int]]
    expected_docs: set[str]
    index_docs: list[str]
    index_count: int
    stream_checkpoints: list[str]
    sql_checkpoints: list[tuple[str, str, int, int]]
    dead_letters: int
    floors: dict[str, int]  # durable -> ack floor


def _dupes(values: Iterable[str]) -> int:
    """How many entries repeat an earlier one."""
    return sum(n - 1 for n in Counter(values).values() if n > 1)


def _n(count: int, what: str) -> str:
    return f"{count:,} {what}"


def check_all(s: Snapshot) -> list[Check]:
    checks: list[Check] = []

    def add(name: str, expected: str, found: str, ok: bool) -> None:
        checks.append(Check(name, expected, found, ok))

    for durable, floor in sorted(s.floors.items()):
        add(f"{durable} acked everything", f"ack floor ≥ {s.upto:,}", f"{floor:,}", floor >= s.upto)

    stream_seq: dict[str, int] = {}
    for event_id, seq in s.stream_events:
        stream_seq.setdefault(event_id, seq)  # a copy (if any) is reported below, not here
    sql_ids = [i for i, _ in s.sql_events]
    sql_set = set(sql_ids)
    acked = s.acked

    missing_stream = [i for i in acked if i not in stream_seq]
    add(
        "every acked event is in the stream",
        _n(len(acked), "events"),
        f"{len(acked) - len(missing_stream):,} ({len(missing_stream):,} missing)",
        not missing_stream,
    )
    moved = [i for i, seq in acked.items() if i in stream_seq and stream_seq[i] != seq]
    add("each acked event at the seq its PubAck gave", "0 elsewhere", _n(len(moved), "elsewhere"), not moved)
    stream_dupes = _dupes(i for i, _ in s.stream_events)
    add("the stream holds each event once (dedupe held)", "0 copies", _n(stream_dupes, "copies"), stream_dupes == 0)

    missing_sql = [i for i in acked if i not in sql_set]
    add(
        "every acked event is in SQL",
        _n(len(acked), "events"),
        f"{len(acked) - len(missing_sql):,} ({len(missing_sql):,} missing)",
        not missing_sql,
    )
    sql_dupes = _dupes(sql_ids)
    add("SQL holds each event once", "0 duplicate rows", _n(sql_dupes, "duplicate rows"), sql_dupes == 0)
    strays = sql_set - set(stream_seq)
    add("SQL holds nothing the stream does not", "0 rows", _n(len(strays), "rows"), not strays)
    wrong_seq = [i for i, seq in s.sql_events if i in stream_seq and stream_seq[i] != seq]
    add("SQL rows at their stream seq", "0 elsewhere", _n(len(wrong_seq), "elsewhere"), not wrong_seq)

    index_set = set(s.index_docs)
    missing_docs = s.expected_docs - index_set
    extra_docs = index_set - s.expected_docs
    add(
        "the index holds every indexable message",
        _n(len(s.expected_docs), "docs"),
        f"{len(s.expected_docs) - len(missing_docs):,} ({len(missing_docs):,} missing)",
        not missing_docs,
    )
    add("the index holds nothing else", "0 docs", _n(len(extra_docs), "docs"), not extra_docs)
    index_dupes = _dupes(s.index_docs) + max(0, s.index_count - len(s.index_docs))
    add(
        "the index holds each doc once",
        "0 duplicates",
        f"{index_dupes:,} duplicates ({s.index_count:,} objects, {len(index_set):,} distinct)",
        index_dupes == 0,
    )

    made = len(set(s.stream_checkpoints))
    add("the summarizers made checkpoints", "> 0", f"{made:,}", made > 0)
    cp_dupes = _dupes(s.stream_checkpoints)
    add("each checkpoint published once", "0 copies", _n(cp_dupes, "copies"), cp_dupes == 0)
    sql_cp_ids = [cid for _, cid, _, _ in s.sql_checkpoints]
    add(
        "SQL holds each checkpoint once",
        _n(made, "checkpoints"),
        f"{len(sql_cp_ids):,} rows, {len(set(sql_cp_ids)):,} distinct",
        len(sql_cp_ids) == len(set(sql_cp_ids)) == made,
    )
    add(
        "no range summarized twice",
        "0 sessions",
        _n(len(refolded_sessions(s.sql_checkpoints)), "sessions"),
        not refolded_sessions(s.sql_checkpoints),
    )

    add("nothing dead-lettered", "0 messages", _n(s.dead_letters, "messages"), s.dead_letters == 0)
    return checks


def refolded_sessions(checkpoints: Iterable[tuple[str, str, int, int]]) -> set[str]:
    """Sessions whose checkpoints, in stream order, do not strictly advance
    ``up_to_seq``: a second checkpoint of the same (or an older) point means
    two summarizers folded the same events."""
    by_session: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for session_key, _, seq, up_to in checkpoints:
        by_session[session_key].append((seq, up_to))
    bad = set()
    for session_key, rows in by_session.items():
        ups = [up for _, up in sorted(rows)]
        if any(b <= a for a, b in zip(ups, ups[1:])):
            bad.add(session_key)
    return bad
