"""The client's session windows (memq.workers.memory.local): what a held
reply plus one appended event answers, against what the worker's own
strategies answer over the whole window, and which writes drop a window."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from memq.contracts import queries as q
from memq.contracts.schemas import Event, EventAppended, Message, StateSet, TextPart, UserDeleted
from memq.workers.memory.context import assemble
from memq.workers.memory.local import (
    Held,
    HeldHistory,
    LocalWindows,
    appended_event,
    extend_history,
    fresh,
    hold_context,
    hold_history,
    item_of,
)
from memq.workers.memory.strategies import Strategy, select

STRATEGIES = [
    Strategy(kind="all"),
    Strategy(kind="buffer_window", window=3),
    Strategy(kind="buffer_window", turns=2),
    Strategy(kind="token_window", budget=60, preserve_recent=2),
    Strategy(kind="summary_buffer", budget=60, threshold=0.85, target=0.5, min_recent=2),
    Strategy(kind="summary_buffer", budget=200, min_recent=3),
]


def event_dict(seq: int, role: str, calls: list[str], results: list[str]) -> dict:
    parts: list[dict] = [{"type": "text", "text": f"m{seq}"}]
    parts += [{"type": "tool_call", "id": c, "name": "f", "args": {}} for c in calls]
    parts += [{"type": "tool_result", "id": r, "result": "ok"} for r in results]
    return {"id": f"e{seq}", "author": "a", "message": {"role": role, "parts": parts}}


@st.composite
def windows(draw):
    """A worker's window W (oldest first) and one more event, as stored events."""
    n = draw(st.integers(0, 14))
    ids = ["c0", "c1", "c2", "c3"]
    events = []
    for i in range(n + 1):
        role = draw(st.sampled_from(["user", "assistant", "tool"]))
        calls = draw(st.lists(st.sampled_from(ids), max_size=1)) if role == "assistant" else []
        results = draw(st.lists(st.sampled_from(ids), max_size=1)) if role != "assistant" else []
        tokens = draw(st.integers(1, 40))
        events.append(q.StoredEvent(seq=10 + i, tokens=tokens, event=event_dict(10 + i, role, calls, results)))
    reserved = draw(st.sampled_from([0, 0, 5, 30]))
    return events[:-1], events[-1], reserved


def held_of(window: list[q.StoredEvent], strategy: Strategy, reserved: int) -> HeldHistory:
    """The held reply of a history read over ``window``, as the worker answers it."""
    items = [item_of(e) for e in window]
    selection = select(items, strategy, reserved=reserved)
    by_seq = {e.seq: e for e in window}
    tokens = selection.tokens + reserved
    view = q.HistoryView(
        strategy=strategy.to_dict(),
        events=[],
        tokens=tokens,
        over_budget=tokens > strategy.budget,
        needs_summary=selection.needs_summary,
    )
    events = [Held.of(by_seq[it.seq]) for it in selection.items]
    return HeldHistory(view, strategy, list(selection.items), reserved, events)


@settings(max_examples=1500, deadline=None)
@given(windows(), st.sampled_from(STRATEGIES))
def test_an_extended_history_is_what_the_worker_answers_over_its_whole_window(case, strategy):
    window, new, reserved = case
    if strategy.from_checkpoint is False:
        reserved = 0  # only summary_buffer reserves a checkpoint's tokens
    held = held_of(window, strategy, reserved)
    extended = extend_history(held, new)
    if extended is None:
        return  # the read asks the service
    truth = held_of([*window, new], strategy, reserved).reply()
    answer = extended.reply()
    assert answer.events == truth.events
    assert answer.tokens == truth.tokens
    assert answer.needs_summary == truth.needs_summary
    assert answer.over_budget == truth.over_budget


def test_plain_turns_extend_every_strategy():
    """The fast path is not a fallback in disguise: a conversation without
    tools extends under every strategy, turn after turn."""
    window = [
        q.StoredEvent(seq=i, tokens=7, event=event_dict(i, ["user", "assistant"][i % 2], [], [])) for i in range(1, 9)
    ]
    for strategy in STRATEGIES:
        held = held_of(window, strategy, 0)
        for seq in range(9, 30):
            new = q.StoredEvent(seq=seq, tokens=7, event=event_dict(seq, ["user", "assistant"][seq % 2], [], []))
            extended = extend_history(held, new)
            assert extended is not None, (strategy.kind, seq)
            held = extended
            truth = held_of(
                [
                    *window,
                    *(
                        q.StoredEvent(seq=s, tokens=7, event=event_dict(s, ["user", "assistant"][s % 2], [], []))
                        for s in range(9, seq + 1)
                    ),
                ],
                strategy,
                0,
            )
            assert [e.seq for e in held.events] == [e.seq for e in truth.events]
            assert held.view.needs_summary == truth.view.needs_summary


def test_a_result_whose_call_is_not_held_asks_the_service():
    strategy = Strategy(kind="token_window", budget=20)
    window = [
        q.StoredEvent(seq=1, tokens=15, event=event_dict(1, "assistant", ["c9"], [])),
        q.StoredEvent(seq=2, tokens=15, event=event_dict(2, "user", [], [])),
    ]
    held = held_of(window, strategy, 0)
    assert [e.seq for e in held.events] == [2]
    assert extend_history(held, q.StoredEvent(seq=3, tokens=1, event=event_dict(3, "tool", [], ["c9"]))) is None


def test_a_history_counted_for_another_model_is_not_held():
    view = q.HistoryView(
        strategy=Strategy(kind="all").to_dict(),
        events=[q.StoredEvent(seq=1, tokens=7, event=event_dict(1, "user", [], []))],
        tokens=9,  # the worker counted for another model than the stored counts'
    )
    assert hold_history(view) is None
    assert hold_history(view.model_copy(update={"tokens": 7})) is not None


# --- contexts -------------------------------------------------------------------

SUMMARIES = [
    None,
    "The user asked about the weather.",
    "\n".join(f"Line {i}: the user and the assistant talked about topic number {i} at length." for i in range(12)),
]


def worker_context(window: list[q.StoredEvent], strategy: Strategy, summary: str | None, fmt: str) -> q.ContextView:
    """A context over ``window`` with no instruction, recall or facts, as the
    query worker builds its reply (workers/query/ops.py, one page)."""
    built = assemble(
        history=[item_of(e) for e in window],
        events={e.seq: e.event for e in window},
        strategy=strategy,
        summary=summary,
        recall_limit=0,
    )
    return q.ContextView(
        format=fmt,
        tokens=built.tokens.to_dict(),
        messages=built.to_openai(),
        context=built.to_memq() if fmt == "memq" else None,
        budget=strategy.budget,
        over_budget=built.over_budget,
        note=built.note,
    )


def same_context(answer: q.ContextView, truth: q.ContextView) -> None:
    assert answer.model_dump() == truth.model_dump()


@settings(max_examples=1500, deadline=None)
@given(windows(), st.sampled_from(STRATEGIES), st.sampled_from(SUMMARIES), st.integers(1, 3))
def test_an_extended_context_is_what_the_worker_answers_over_its_whole_window(case, strategy, summary, more):
    """Seeded from memq's format, the held context answers in OpenAI's format
    exactly what the worker would, token counts and note included, after
    each of up to three appended events, or asks the service."""
    window, new, _ = case
    summary = summary if strategy.from_checkpoint else None  # only summary_buffer reads from a checkpoint
    held = hold_context(worker_context(window, strategy, summary, "memq"))
    assert held is not None
    same_context(held.reply(), worker_context(window, strategy, summary, "openai"))
    added = [new]
    for i in range(1, more):  # and plain turns after it
        added.append(q.StoredEvent(seq=new.seq + i, tokens=9, event=event_dict(new.seq + i, "user", [], [])))
    for n, event in enumerate(added, 1):
        held = held.extended(Held.of(event), item_of(event), event.event)
        if held is None:
            return  # the read asks the service
        same_context(held.reply(), worker_context([*window, *added[:n]], strategy, summary, "openai"))


def test_plain_turns_extend_every_context():
    """The fast path is not a fallback in disguise: without tools a context
    extends under every strategy, with a checkpoint summary that fits, turn
    after turn, while the window is trimmed."""
    window = [
        q.StoredEvent(seq=i, tokens=7, event=event_dict(i, ["user", "assistant"][i % 2], [], [])) for i in range(1, 9)
    ]
    for strategy in STRATEGIES:
        summary = SUMMARIES[1] if strategy.from_checkpoint else None
        held = hold_context(worker_context(window, strategy, summary, "memq"))
        events = list(window)
        for seq in range(9, 30):
            new = q.StoredEvent(seq=seq, tokens=7, event=event_dict(seq, ["user", "assistant"][seq % 2], [], []))
            events.append(new)
            held = held.extended(Held.of(new), item_of(new), new.event)
            assert held is not None, (strategy.kind, seq)
            same_context(held.reply(), worker_context(events, strategy, summary, "openai"))


def test_a_caller_changing_its_context_changes_no_later_one():
    window = [
        q.StoredEvent(seq=1, tokens=7, event=event_dict(1, "user", [], [])),
        q.StoredEvent(seq=2, tokens=9, event=event_dict(2, "assistant", ["c1"], [])),
    ]
    held = hold_context(worker_context(window, Strategy(kind="all"), None, "memq"))
    first = held.reply()
    first.messages[0]["content"] = "changed"
    first.messages[1]["tool_calls"][0]["function"]["name"] = "changed"
    first.tokens["total"] = 0
    same_context(held.reply(), worker_context(window, Strategy(kind="all"), None, "openai"))


def test_a_context_whose_summary_was_cut_asks_the_service_after_an_append():
    strategy = Strategy(kind="summary_buffer", budget=60, min_recent=2)
    window = [q.StoredEvent(seq=i, tokens=7, event=event_dict(i, "user", [], [])) for i in range(1, 4)]
    seed = worker_context(window, strategy, SUMMARIES[2], "memq")
    assert seed.context["summary_cut"]
    held = hold_context(seed)
    same_context(held.reply(), worker_context(window, strategy, SUMMARIES[2], "openai"))  # the same read again
    new = q.StoredEvent(seq=4, tokens=7, event=event_dict(4, "user", [], []))
    assert held.extended(Held.of(new), item_of(new), new.event) is None


def test_a_context_that_is_more_than_its_window_is_not_held():
    window = [q.StoredEvent(seq=1, tokens=7, event=event_dict(1, "user", [], []))]
    seed = worker_context(window, Strategy(kind="all"), None, "memq")
    assert hold_context(seed) is not None
    assert hold_context(worker_context(window, Strategy(kind="all"), None, "openai")) is None  # no seqs to grow from
    for part in ({"recalled": [{"seq": 0, "event": {}}]}, {"instruction": "Be brief."}, {"model": "gpt-4o"}):
        assert hold_context(seed.model_copy(update={"context": {**seed.context, **part}})) is None


# --- the windows ------------------------------------------------------------------


def stored_event(seq: int, event: Event) -> q.StoredEvent:
    """An appended event as a read of it returns it."""
    return fresh([appended_event(seq, event)[0]])[0]


def text_event(text: str, **actions) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]), actions=actions)


def session_view(last_seq: int, events: list[q.StoredEvent], state: dict | None = None) -> q.SessionView:
    return q.SessionView(
        app="app",
        user="u",
        session="s",
        created_at=1.0,
        updated_at=2.0,
        last_seq=last_seq,
        state=state or {},
        events=events,
    )


def get(num: int | None = None, **fields) -> q.SessionGet:
    return q.SessionGet(app="app", user="u", session="s", events=True, num_recent_events=num, **fields)


def seeded(local: LocalWindows, last_seq: int = 5, min_seq: int = 5, num: int | None = 50) -> None:
    events = [stored_event(seq, text_event(f"t{seq}")) for seq in range(1, last_seq + 1)]
    request = get(num)
    local.seed(
        "session.get", request, session_view(last_seq, events, {"k": 1}), min_seq, local.seeds("session.get", request)
    )


def test_an_acknowledged_conditional_append_extends_the_window():
    local = LocalWindows()
    local.bind("app")
    seeded(local)
    assert local.expect("u", "s") == 5
    event = text_event("new", state_delta={"k": 2, "user:lang": "fr", "temp:x": 1})
    local.appended("u", "s", 5, 9, event)
    view = local.answer("session.get", get(3))
    assert [e.seq for e in view.events] == [4, 5, 9]
    assert view.events[-1] == stored_event(9, event)
    assert view.last_seq == 9 and view.updated_at == event.timestamp and view.created_at == 1.0
    assert view.state == {"k": 2, "user:lang": "fr"}  # temp: keys are never stored
    assert local.expect("u", "s") == 9


def test_a_caller_changing_its_answer_changes_no_later_one():
    local = LocalWindows()
    seeded(local)
    first = local.answer("session.get", get(2))
    first.events[-1].event["message"]["parts"][0]["text"] = "changed"
    first.state["k"] = "changed"
    again = local.answer("session.get", get(2))
    assert again.events[-1].event["message"]["parts"][0]["text"] == "t5"
    assert again.state == {"k": 1}


def test_a_reply_beyond_what_the_read_waited_for_seeds_nothing():
    local = LocalWindows()
    seeded(local, last_seq=5, min_seq=4)  # a message above the floor: others below it may be missing
    assert local.expect("u", "s") is None


def test_a_window_holds_no_more_than_it_was_given():
    local = LocalWindows()
    seeded(local, last_seq=5, num=5)  # five asked, five came: there may be older ones
    assert local.answer("session.get", get(5)) is not None
    assert local.answer("session.get", get(6)) is None
    assert local.answer("session.get", get(None)) is None
    seeded(local, last_seq=5, num=None)  # all of them
    assert len(local.answer("session.get", get(None)).events) == 5
    assert [e.seq for e in local.answer("session.get", get(8)).events] == [1, 2, 3, 4, 5]  # more than there are


def test_what_drops_a_window():
    def fresh() -> LocalWindows:
        local = LocalWindows()
        seeded(local)
        return local

    cases = {
        "an append that expected another sequence": lambda w: w.appended("u", "s", 4, 9, text_event("x")),
        "an append without the check": lambda w: w.appended("u", "s", None, 9, text_event("x")),
        "an event id held already": lambda w: w.appended(
            "u",
            "s",
            5,
            9,
            Event.model_validate(
                {**text_event("x").model_dump(), "id": w.answer("session.get", get(1)).events[0].event["id"]}
            ),
        ),
        "a session state set": lambda w: w.wrote(StateSet(app="app", user="u", session="s", delta={"k": 3}), 9),
        "user state": lambda w: w.wrote(StateSet(app="app", user="u", delta={"user:k": 3}), 9),
        "app state under another user": lambda w: w.wrote(StateSet(app="app", user="v", delta={"app:k": 3}), 9),
        "a user delete": lambda w: w.wrote(UserDeleted(app="app", user="u"), 9),
        "a user: key in another session's event": lambda w: w.wrote(
            EventAppended(app="app", user="u", session="t", event=text_event("x", state_delta={"user:k": 1})), 9
        ),
    }
    for why, write in cases.items():
        local = fresh()
        write(local)
        assert local.answer("session.get", get(1)) is None, why
    local = fresh()
    local.wrote(StateSet(app="app", user="v", delta={"user:k": 3}), 9)  # another user's own state
    local.wrote(EventAppended(app="app", user="u", session="t", event=text_event("x")), 10)  # a plain event elsewhere
    assert local.answer("session.get", get(1)) is not None


def test_a_read_that_began_before_an_own_write_seeds_nothing():
    local = LocalWindows()
    request = get(5)
    ticket = local.seeds("session.get", request)
    local.wrote(StateSet(app="app", user="u", delta={"user:k": 3}), 6)
    events = [stored_event(1, text_event("a"))]
    local.seed("session.get", request, session_view(5, events), 5, ticket)
    assert local.expect("u", "s") is None


def test_windows_are_bounded_and_age():
    clock = [0.0]
    local = LocalWindows(max_sessions=3, max_events=4, clock=lambda: clock[0])
    for i in range(10):
        request = q.SessionGet(app="app", user="u", session=f"s{i}", events=True)
        view = session_view(5, [stored_event(s, text_event("t")) for s in range(1, 6)]).model_copy(
            update={"session": f"s{i}"}
        )
        local.seed("session.get", request, view, 5, local.seeds("session.get", request))
    assert len(local) == 3
    assert local.expect("u", "s9") == 5 and local.expect("u", "s0") is None
    request = q.SessionGet(app="app", user="u", session="s9", events=True, num_recent_events=4)
    assert len(local.answer("session.get", request).events) == 4
    assert local.answer("session.get", request.model_copy(update={"num_recent_events": None})) is None  # cut to 4
    clock[0] = 31.0
    assert local.answer("session.get", request) is None and local.expect("u", "s9") is None


def test_reads_that_are_never_answered_here():
    local = LocalWindows()
    seeded(local)
    assert local.answer("session.get", get(1)) is not None
    assert local.answer("session.get", get(1, consistency="any")) is None
    assert local.answer("session.get", get(1, min_seq=3)) is None
    assert local.answer("session.get", get(1, roles=["user"])) is None
    assert local.answer("session.get", get(1, after=time.time() - 60)) is None


def test_one_instance_serves_one_app():
    local = LocalWindows()
    local.bind("a")
    local.bind("a")
    try:
        local.bind("b")
    except ValueError:
        pass
    else:
        raise AssertionError("a second app's client was given the same windows")
