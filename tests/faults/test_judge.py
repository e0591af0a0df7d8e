"""The fault suite's judge flags every kind of wrong answer (pure, no server):
without this, a fault test that passes could mean a judge that never fails."""

from __future__ import annotations

from types import SimpleNamespace as NS

from memq.contracts.errors import MemqError, NotCommitted, Unavailable, error_from_dict

from .load import Ledger
from .probe import (
    classify_error,
    judge_context,
    judge_events,
    judge_history,
    judge_search,
)

REF = ("u0", "s0")


def ledger() -> Ledger:
    lg = Ledger("app")
    for i, (user, session) in enumerate([REF, REF, REF, ("u1", "s1"), REF]):
        s = lg.add(user, session, f"e{i}", f"tok{i}")
        s.seq = 10 + i
    lg.sent["e4"].seq = None  # published, ack not (yet) back
    return lg


def seen(*ids: str, lg: Ledger | None = None) -> list[tuple[int, str]]:
    lg = lg or ledger()
    return [(lg.sent[i].seq or 14, i) for i in ids]


def test_a_complete_answer_is_correct():
    lg = ledger()
    assert judge_events(seen("e0", "e1", "e2"), ledger=lg, ref=REF, expected=lg.acked(REF)) == []
    # newer than min_seq, even not yet acked: fine
    assert judge_events(seen("e0", "e1", "e2", "e4"), ledger=lg, ref=REF, expected=lg.acked(REF)) == []


def test_each_kind_of_wrong_answer_is_flagged():
    lg = ledger()
    acked = lg.acked(REF)
    cases = {
        "never published": [(10, "e0"), (11, "e1"), (12, "e2"), (13, "ghost")],
        "duplicate": [(10, "e0"), (11, "e1"), (11, "e1"), (12, "e2")],
        "out of order": [(11, "e1"), (10, "e0"), (12, "e2")],
        "of u1/s1": [(10, "e0"), (11, "e1"), (12, "e2"), (13, "e3")],
        "misses 1 acked": [(10, "e0"), (12, "e2")],
        "acked at seq 11": [(10, "e0"), (99, "e1"), (12, "e2")],
    }
    for what, answer in cases.items():
        problems = judge_events(answer, ledger=lg, ref=REF, expected=acked)
        assert any(what in p for p in problems), (what, problems)


def _history(pairs, checkpoint_seq=None):
    return NS(events=[NS(seq=s, event={"id": i}) for s, i in pairs], checkpoint_seq=checkpoint_seq)


def test_history_and_context():
    lg = ledger()
    acked = lg.acked(REF)
    assert judge_history(_history(seen("e0", "e1", "e2")), ledger=lg, ref=REF, expected=acked) == []
    assert judge_history(_history(seen("e0")), ledger=lg, ref=REF, expected=acked)
    # summary_buffer: nothing at or below the checkpoint comes back verbatim
    assert judge_history(_history(seen("e1", "e2"), checkpoint_seq=11), ledger=lg, ref=REF, expected=(), complete=False)
    assert not judge_history(_history(seen("e2"), checkpoint_seq=11), ledger=lg, ref=REF, expected=(), complete=False)

    def ctx(window, recalled):
        def ev(s, i, role="user"):
            return {"seq": s, "event": {"id": i, "message": {"role": role}}}

        return NS(context={"window": [ev(s, i) for s, i in window], "recalled": [ev(s, i, r) for s, i, r in recalled]})

    window = seen("e0", "e1", "e2")
    assert judge_context(ctx(window, [(13, "cp-1", "summary")]), ledger=lg, ref=REF, expected=acked) == []
    assert judge_context(ctx(window, [(13, "e3", "user")]), ledger=lg, ref=REF, expected=acked)  # another user's memory
    assert judge_context(ctx(window, [(10, "e0", "user"), (10, "e0", "user")]), ledger=lg, ref=REF, expected=acked)


def test_search():
    lg = ledger()

    def results(*hits):
        return NS(
            results=[
                NS(event_id=i, session_id=sess, metadata={"app": app, "user": user, "seq": seq, "role": "user"})
                for i, app, user, sess, seq in hits
            ]
        )

    target = lg.sent["e1"]
    good = results(("e1", "app", "u0", "s0", 11), ("e2", "app", "u0", "s0", 12))
    assert judge_search(good, ledger=lg, app="app", ref=REF, target=target) == []
    assert judge_search(results(("e2", "app", "u0", "s0", 12)), ledger=lg, app="app", ref=REF, target=target)
    assert judge_search(results(("e1", "app", "u1", "s0", 11)), ledger=lg, app="app", ref=REF, target=None)
    assert judge_search(results(("e1", "other", "u0", "s0", 11)), ledger=lg, app="app", ref=REF, target=None)
    assert judge_search(
        results(("e1", "app", "u0", "s0", 11), ("e1", "app", "u0", "s0", 11)),
        ledger=lg,
        app="app",
        ref=REF,
        target=None,
    )


def test_outcomes_are_classified():
    assert classify_error(Unavailable("no query service is answering within 4s"), elapsed=4.01, patience=4) == "late"
    assert classify_error(Unavailable("no query service is answering"), elapsed=0.01, patience=4) == "error:unavailable"
    assert classify_error(Unavailable("history: the database is unavailable, retry later")) == "error:unavailable"
    assert classify_error(NotCommitted("sequence 9 is not committed yet")) == "error:not_committed"
    assert classify_error(error_from_dict({"code": "internal", "message": "history failed"})) == "error:internal"
    assert classify_error(MemqError("x")) == "error:internal"
    assert classify_error(ConnectionResetError()) == "untyped:ConnectionResetError"
