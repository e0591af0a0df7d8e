"""Context assembly: order, budget, recall, and totals equal to counting the
OpenAI rendering exactly."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.contracts.schemas import Event, Message, TextPart, ToolCallPart, ToolResultPart
from memq.workers.memory import tokens as tk
from memq.workers.memory.context import (
    CUT_MARK,
    KNOWN_HEADER,
    RECALL_HEADER,
    SUMMARY_HEADER,
    assemble,
    fit_summary,
    item_from_event,
    known_message,
    pick_known,
    recall_message,
    summary_message,
)
from memq.workers.memory.strategies import Strategy

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def text_event(role: str, text: str, ts: float = 1_714_521_600.0) -> dict:  # 2024-05-01 UTC
    return Event(message=Message(role=role, parts=[TextPart(text=text)]), timestamp=ts).model_dump()


def session(n: int, words: int = 20, model: str | None = None):
    events = {}
    for seq in range(1, n + 1):
        role = "user" if seq % 2 else "assistant"
        text = " ".join(WORDS[(seq + i) % len(WORDS)] for i in range(words))
        events[seq] = text_event(role, f"message {seq}: {text}")
    items = [item_from_event(seq, ev, model=model) for seq, ev in events.items()]
    return items, events


def check_total(ctx, model=None):
    assert ctx.tokens.total == tk.count_messages(ctx.to_openai(), model)
    t = ctx.tokens
    assert t.total == t.instruction + t.known + t.recalled + t.summary + t.window + 3


def test_order_and_counts():
    items, events = session(6)
    recalled = [(100, text_event("user", "I live in Lisbon.", ts=1_700_000_000.0), 9)]
    ctx = assemble(
        history=items,
        events=events,
        strategy=Strategy(),
        summary="The user asked about Greek letters.",
        recalled=recalled,
        instruction="You are terse.",
    )
    msgs = ctx.to_openai()
    assert msgs[0] == {"role": "system", "content": "You are terse."}
    assert msgs[1]["role"] == "system" and msgs[1]["content"].startswith(RECALL_HEADER)
    assert "- [2023-11-14, user] I live in Lisbon." in msgs[1]["content"]
    assert msgs[2] == {"role": "system", "content": f"{SUMMARY_HEADER}\nThe user asked about Greek letters."}
    assert [m["content"] for m in msgs[3:]] == [tk.event_text(events[s]) for s in range(1, 7)]
    check_total(ctx)
    assert ctx.tokens.instruction == tk.message_tokens(msgs[0])
    assert ctx.tokens.recalled == tk.message_tokens(msgs[1])
    assert ctx.tokens.summary == tk.message_tokens(msgs[2])
    assert ctx.tokens.window == sum(tk.count_event(events[s]) for s in range(1, 7))


def test_empty_context():
    ctx = assemble(history=[], events={}, strategy=Strategy())
    assert ctx.to_openai() == []
    assert ctx.tokens.total == 3 == tk.count_messages([])


def test_counts_for_another_model():
    items, events = session(5, model="gpt-4o")
    ctx = assemble(history=items, events=events, strategy=Strategy(), instruction="hi", model="gpt-4o")
    check_total(ctx, "gpt-4o")
    memq = ctx.to_memq()
    assert memq["encoding"] == tk.choose_encoding("gpt-4o").used
    assert memq["approximate"] == tk.is_approximate("gpt-4o")


def test_tool_calls_render_as_openai_expects():
    events = {
        1: text_event("user", "weather in Paris and Rome?"),
        2: Event(
            message=Message(
                role="assistant",
                parts=[
                    ToolCallPart(id="a", name="weather", args={"city": "Paris"}),
                    ToolCallPart(id="b", name="weather", args={"city": "Rome"}),
                ],
            )
        ).model_dump(),
        3: Event(
            message=Message(
                role="tool", parts=[ToolResultPart(id="a", result={"t": 21}), ToolResultPart(id="b", result={"t": 25})]
            )
        ).model_dump(),
        4: text_event("assistant", "21 and 25."),
    }
    items = [item_from_event(s, e) for s, e in events.items()]
    assert items[1].call_ids == {"a", "b"} and items[2].result_ids == {"a", "b"}
    ctx = assemble(history=items, events=events, strategy=Strategy())
    msgs = ctx.to_openai()
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m.get("tool_call_id") for m in msgs[2:4]] == ["a", "b"]
    check_total(ctx)
    # a token window that cannot hold the whole tool unit drops it whole
    small = Strategy(kind="token_window", budget=ctx.tokens.window - items[0].tokens - 1 + 3)
    ctx2 = assemble(history=items, events=events, strategy=small)
    assert [it.seq for it in ctx2.window] == [4]
    check_total(ctx2)


def test_token_bounded_contexts_stay_within_budget():
    items, events = session(40)
    strategy = Strategy(kind="token_window", budget=600)
    ctx = assemble(history=items, events=events, strategy=strategy, instruction="Be kind.", summary="Earlier: letters.")
    assert ctx.tokens.total <= 600 and not ctx.over_budget
    assert ctx.window and ctx.window[-1].seq == 40
    check_total(ctx)


def test_all_can_go_over_budget_and_says_so():
    items, events = session(40)
    ctx = assemble(history=items, events=events, strategy=Strategy(kind="all", budget=100))
    assert len(ctx.window) == 40 and ctx.over_budget and ctx.to_memq()["over_budget"]
    check_total(ctx)


def test_all_names_itself_and_the_numbers_when_over():
    items, events = session(40)
    ctx = assemble(history=items, events=events, strategy=Strategy(kind="none", budget=100))
    assert ctx.strategy.kind == "all"
    note = ctx.budget_note
    assert note == ctx.to_memq()["note"]
    assert f"{ctx.tokens.total} tokens for a budget of 100" in note and "all keeps every event" in note
    window = assemble(history=items, events=events, strategy=Strategy(kind="buffer_window", window=30, budget=100))
    assert window.over_budget and "buffer_window counts messages" in window.budget_note
    fits = assemble(history=items, events=events, strategy=Strategy(kind="all", budget=100_000))
    assert not fits.over_budget and fits.budget_note is None and fits.to_memq()["note"] is None
    # token-bounded: over only when the fixed parts alone do not fit
    crowded = assemble(history=items, events=events, strategy=Strategy(budget=20), instruction="Be brief. " * 20)
    assert crowded.window == () and crowded.over_budget and "instruction alone" in crowded.budget_note


def tool_session(n: int):
    """``session(n)`` with a tool call and its result in the middle of every 10 events."""
    events = {}
    for seq in range(1, n + 1):
        if seq % 10 == 5:
            part = ToolCallPart(id=f"c{seq}", name="lookup", args={"q": " ".join(WORDS)})
            events[seq] = Event(message=Message(role="assistant", parts=[part])).model_dump()
        elif seq % 10 == 6:
            part = ToolResultPart(id=f"c{seq - 1}", result={"found": " ".join(WORDS * 3)})
            events[seq] = Event(message=Message(role="tool", parts=[part])).model_dump()
        else:
            events[seq] = text_event("user" if seq % 2 else "assistant", f"message {seq}: " + " ".join(WORDS))
    return [item_from_event(seq, ev) for seq, ev in events.items()], events


@pytest.mark.parametrize("budget", range(60, 400, 7))
def test_the_default_context_fits_its_budget_before_any_summary(budget):
    # No checkpoint yet (the summarizer has not run) and far over the budget:
    # the default strategy still fits, dropping the oldest, never a call
    # without its result.
    items, events = tool_session(100)
    assert sum(it.tokens for it in items) > 5 * budget
    recalled = [(900, text_event("user", "I live in Lisbon."), 0)]
    ctx = assemble(
        history=items, events=events, strategy=Strategy(budget=budget), instruction="Be kind.", recalled=recalled
    )
    assert ctx.strategy.kind == "summary_buffer"
    assert ctx.tokens.total <= budget and not ctx.over_budget and ctx.budget_note is None
    assert ctx.window[-1].seq == 100  # the newest always fits these budgets
    check_total(ctx)
    msgs = ctx.to_openai()
    called = {c["id"] for m in msgs for c in m.get("tool_calls") or ()}
    assert all(m["tool_call_id"] in called for m in msgs if m["role"] == "tool")


def test_summary_buffer_without_a_recall_share_keeps_every_event_after_the_checkpoint_and_recall_gets_the_rest():
    items, events = session(10)
    window_tokens = sum(it.tokens for it in items)
    recalled = [(1000 + i, text_event("user", f"old fact {i}"), 8) for i in range(10)]
    summary_cost = tk.message_tokens({"role": "system", "content": f"{SUMMARY_HEADER}\ns"})
    budget = window_tokens + summary_cost + 3 + 45  # room for a few memories
    ctx = assemble(
        history=items,
        events=events,
        strategy=Strategy(kind="summary_buffer", budget=budget, threshold=1.0, target=0.9, recall_share=0.0),
        summary="s",
        recalled=recalled,
    )
    assert [it.seq for it in ctx.window] == list(range(1, 11))  # all of them
    assert 0 < len(ctx.recalled) < 5  # what is left of the budget, not more
    assert ctx.tokens.total <= budget
    check_total(ctx)


def test_summary_buffer_gives_recall_its_share_before_older_messages_and_the_summary():
    items, events = session(30)
    recalled = [(1000 + i, text_event("user", f"old fact number {i} about the garden"), 0) for i in range(40)]
    summary = "\n".join(f"line {i}: " + " ".join(WORDS) for i in range(20))
    strategy = Strategy(kind="summary_buffer", budget=1200, threshold=1.0, target=0.9, min_recent=3)
    without = assemble(
        history=items,
        events=events,
        strategy=dataclasses.replace(strategy, recall_share=0.0),
        summary=summary,
        recalled=recalled,
        recall_limit=40,
    )
    shared = assemble(
        history=items,
        events=events,
        strategy=dataclasses.replace(strategy, recall_share=0.5),
        summary=summary,
        recalled=recalled,
        recall_limit=40,
    )
    assert shared.tokens.recalled > without.tokens.recalled
    # the share holds: recall takes at least its share's worth of memories
    # (less one memory that did not fit whole), the rest makes do with less
    line = tk.message_tokens(recall_message([recalled[0][:2]])) - tk.message_tokens(recall_message(()))
    assert shared.tokens.recalled >= (1200 - 3) // 2 - line
    assert len(shared.window) < len(without.window) or shared.tokens.summary < without.tokens.summary
    assert [it.seq for it in shared.window][-3:] == [28, 29, 30]  # min_recent is never crowded out
    for ctx in (without, shared):
        assert ctx.tokens.total <= 1200
        check_total(ctx)


def test_a_recall_share_without_memories_leaves_the_context_as_it_was():
    items, events = session(30)
    strategy = Strategy(kind="summary_buffer", budget=900, threshold=1.0, target=0.9)
    plain = assemble(history=items, events=events, strategy=dataclasses.replace(strategy, recall_share=0.0))
    for recalled, limit in (((), 20), ([(900, text_event("user", "a fact"), 0)], 0)):
        ctx = assemble(history=items, events=events, strategy=strategy, recalled=recalled, recall_limit=limit)
        assert ctx.window == plain.window and ctx.tokens == plain.tokens


def test_recall_share_never_crowds_out_min_recent():
    items, events = session(30)
    last3 = sum(it.tokens for it in items[-3:])
    big = [(900 + i, text_event("user", " ".join(WORDS * 4)), 0) for i in range(5)]
    strategy = Strategy(kind="summary_buffer", budget=last3 + 3 + 60, recall_share=0.9, min_recent=3)
    ctx = assemble(history=items, events=events, strategy=strategy, recalled=big)
    assert [it.seq for it in ctx.window][-3:] == [28, 29, 30]
    assert ctx.recalled == () and ctx.tokens.total <= strategy.budget
    check_total(ctx)


def test_recall_skips_what_the_window_already_has_and_respects_the_limit():
    items, events = session(8)
    recalled = [(seq, events[seq], items[seq - 1].tokens) for seq in (8, 7)]
    recalled += [(500 + i, text_event("assistant", f"memory {i}"), 7) for i in range(9)]
    recalled.append((500, text_event("assistant", "memory 0 again"), 7))  # duplicate seq
    window4, window1 = Strategy(kind="buffer_window", window=4), Strategy(kind="buffer_window", window=1)
    ctx = assemble(history=items, events=events, strategy=window4, recalled=recalled, recall_limit=5)
    assert [s for s, _ in ctx.recalled] == [500, 501, 502, 503, 504]
    ctx = assemble(history=items, events=events, strategy=window1, recalled=recalled, recall_limit=3)
    assert [s for s, _ in ctx.recalled] == [7, 500, 501]  # 7 fell out of the window
    ctx = assemble(history=items, events=events, strategy=Strategy(), recalled=recalled, recall_limit=0)
    assert ctx.recalled == () and ctx.tokens.recalled == 0


def test_recall_never_crowds_out_preserve_recent():
    items, events = session(30)
    last5 = sum(it.tokens for it in items[-5:])
    big = [(900 + i, text_event("user", " ".join(WORDS * 4)), 200) for i in range(5)]
    strategy = Strategy(kind="token_window", budget=last5 + 3 + 60, preserve_recent=5)
    ctx = assemble(history=items, events=events, strategy=strategy, recalled=big)
    assert [it.seq for it in ctx.window][-5:] == [26, 27, 28, 29, 30]
    assert ctx.recalled == ()  # none of the big memories fits next to them
    assert ctx.tokens.total <= strategy.budget
    check_total(ctx)


def test_token_window_gives_recall_room_before_old_messages():
    items, events = session(30)
    small = [(900, text_event("user", "I am allergic to peanuts."), 12)]
    strategy = Strategy(kind="token_window", budget=800)
    without = assemble(history=items, events=events, strategy=strategy)
    with_recall = assemble(history=items, events=events, strategy=strategy, recalled=small)
    assert [s for s, _ in with_recall.recalled] == [900]
    assert len(with_recall.window) < len(without.window)
    assert with_recall.tokens.total <= 800
    check_total(with_recall)


def test_summary_request_is_reported():
    items, events = session(30)
    total = sum(it.tokens for it in items)
    strategy = Strategy(kind="summary_buffer", budget=int(total / 0.9))
    ctx = assemble(history=items, events=events, strategy=strategy)
    assert ctx.needs_summary and ctx.summarize_up_to is not None
    assert ctx.to_memq()["summarize_up_to"] == ctx.summarize_up_to


def test_to_memq_is_json():
    items, events = session(4)
    ctx = assemble(
        history=items,
        events=events,
        strategy=Strategy(kind="token_window"),
        instruction="x",
        summary="y",
        recalled=[(99, text_event("user", "z"), 5)],
    )
    data = orjson.loads(orjson.dumps(ctx.to_memq()))
    assert data["tokens"] == ctx.tokens.to_dict()
    assert [w["seq"] for w in data["window"]] == [1, 2, 3, 4]
    assert data["recalled"][0]["seq"] == 99 and data["summary"] == "y" and data["instruction"] == "x"
    assert data["strategy"]["kind"] == "token_window"


def test_recall_message_without_timestamp():
    msg = recall_message([(1, {"message": {"role": "user", "parts": [{"type": "text", "text": "hi"}]}})])
    assert msg["content"] == f"{RECALL_HEADER}\n- [user] hi"


def test_recall_message_names_the_speaker_and_the_date():
    event = Event(
        author="Caroline", message=Message(role="assistant", parts=[TextPart(text="I went to a support group.")])
    ).model_dump() | {"timestamp": 1_683_504_000.0}
    msg = recall_message([(1, event)])
    assert msg["content"] == f"{RECALL_HEADER}\n- [2023-05-08, Caroline] I went to a support group."


# --- property: totals are exact, budgets hold, OpenAI tool rules hold -----------


@st.composite
def histories(draw):
    n = draw(st.integers(0, 25))
    events: dict[int, dict] = {}
    open_calls: list[str] = []
    for seq in range(1, n + 1):
        kind = draw(st.sampled_from(["user", "assistant", "call", "result"]))
        words = " ".join(draw(st.lists(st.sampled_from(WORDS + ["<|endoftext|>", "日本", "{}"]), max_size=30)))
        if kind == "call":
            ids = [f"c{seq}_{i}" for i in range(draw(st.integers(1, 2)))]
            open_calls += ids
            parts = [ToolCallPart(id=i, name="f", args={"q": words}) for i in ids]
            events[seq] = Event(message=Message(role="assistant", parts=parts)).model_dump()
        elif kind == "result" and open_calls:
            cid = open_calls.pop(0)
            result = ToolResultPart(id=cid, result={"r": words})
            events[seq] = Event(message=Message(role="tool", parts=[result])).model_dump()
        else:
            events[seq] = text_event("user" if kind == "user" else "assistant", words)
    return events


@settings(max_examples=150, deadline=None)
@given(
    events=histories(),
    kind=st.sampled_from(["all", "buffer_window", "token_window", "summary_buffer"]),
    budget=st.integers(0, 1500),
    window=st.integers(1, 10),
    instruction=st.sampled_from([None, "", "Answer in {lang}.", "Be brief. " * 10]),
    summary=st.sampled_from([None, "They talked about alpha.", "x " * 100]),
    n_recalled=st.integers(0, 8),
    recall_limit=st.integers(0, 5),
    recall_share=st.sampled_from([0.0, 0.3, 0.9]),
)
def test_assembly_properties(
    events, kind, budget, window, instruction, summary, n_recalled, recall_limit, recall_share
):
    items = [item_from_event(s, e) for s, e in events.items()]
    recalled = [(s, events[s], items[s - 1].tokens) for s in list(events)[:n_recalled]]
    recalled += [(1000 + i, text_event("user", f"fact {i} " * (i + 1)), 0) for i in range(n_recalled)]
    strategy = Strategy(kind=kind, budget=budget, window=window, threshold=1.0, target=0.7, recall_share=recall_share)
    ctx = assemble(
        history=items,
        events=events,
        strategy=strategy,
        summary=summary,
        recalled=recalled,
        recall_limit=recall_limit,
        instruction=instruction,
    )
    msgs = ctx.to_openai()
    assert ctx.tokens.total == tk.count_messages(msgs)
    base = ctx.tokens.instruction + ctx.tokens.summary + 3
    if strategy.token_bounded and base <= budget:
        assert ctx.tokens.total <= budget
    if kind != "all" and ctx.recalled:
        assert ctx.tokens.total <= budget or ctx.tokens.recalled == 0
    window_seqs = {it.seq for it in ctx.window}
    assert len(ctx.recalled) <= recall_limit
    assert not window_seqs & {s for s, _ in ctx.recalled}
    # every tool message answers a call made earlier in the window
    called: set[str] = set()
    for m in msgs:
        called |= {c["id"] for c in m.get("tool_calls") or ()}
        if m["role"] == "tool":
            assert m["tool_call_id"] in called
    # and every result in the window is rendered
    answered = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
    assert sorted(answered) == sorted(r for it in ctx.window for r in it.result_ids)


@settings(max_examples=150, deadline=None)
@given(
    events=histories(),
    budget=st.integers(0, 1500),
    instruction=st.sampled_from([None, "Answer in {lang}.", "Be brief. " * 10]),
    summary=st.sampled_from([None, "They talked about alpha.", "x " * 100]),
    n_recalled=st.integers(0, 8),
    n_known=st.integers(0, 6),
)
def test_the_default_strategy_never_goes_over_budget(events, budget, instruction, summary, n_recalled, n_known):
    # Hector's defaults (threshold 0.85, target 0.7, min_recent 3) with any
    # budget: whatever the history, only the fixed parts can overflow it.
    items = [item_from_event(s, e) for s, e in events.items()]
    recalled = [(1000 + i, text_event("user", f"fact {i} " * (i + 1)), 0) for i in range(n_recalled)]
    ctx = assemble(
        history=items,
        events=events,
        strategy=Strategy(budget=budget),
        summary=summary,
        recalled=recalled,
        instruction=instruction,
        known=[(f"f{i}", f"The user knows fact {i}. " * (i + 1)) for i in range(n_known)],
        known_limit=n_known,
    )
    assert ctx.tokens.total == tk.count_messages(ctx.to_openai())
    fixed = ctx.tokens.instruction + ctx.tokens.summary + 3
    assert ctx.over_budget == (fixed + ctx.tokens.known > budget)
    assert ctx.tokens.known == 0 or ctx.tokens.instruction + ctx.tokens.known + 3 <= budget  # facts only in room
    if fixed <= budget:
        assert ctx.tokens.total <= budget


def test_item_from_event_uses_a_stored_count():
    ev = text_event("user", "hello world")
    assert item_from_event(3, ev).tokens == tk.count_event(ev) == 6
    assert item_from_event(3, ev, tokens=42).tokens == 42
    assert item_from_event(4, Event(message=None).model_dump()).role == ""


@pytest.mark.parametrize("kind", ["all", "buffer_window", "token_window", "summary_buffer"])
def test_each_strategy_renders_exactly(kind):
    items, events = session(25)
    ctx = assemble(
        history=items,
        events=events,
        strategy=Strategy(kind=kind, budget=700, window=7),
        instruction="i",
        summary="s",
        recalled=[(77, text_event("user", "r"), 4)],
    )
    check_total(ctx)


def summary_lines(n: int) -> str:
    return "\n".join(
        f"[2026-05-{1 + i % 28:02d}] user: fact number {i} about " + " ".join(WORDS[: 3 + i % 5]) for i in range(n)
    )


@pytest.mark.parametrize("room", [0, 5, 12, 20, 40, 90, 300, 5000])
def test_fit_summary_keeps_the_newest_lines_within_room(room):
    summary = summary_lines(60)
    fitted = fit_summary(summary, room)
    if fitted is None:
        assert room <= tk.message_tokens(summary_message(CUT_MARK))  # room for the mark alone: nothing worth sending
        return
    assert tk.message_tokens(summary_message(fitted)) <= room
    if fitted == summary:
        return
    lines = fitted.splitlines()
    assert lines[0].startswith(CUT_MARK)
    if len(lines) > 1:  # whole lines: the newest ones, in order, and as many as fit
        assert summary.endswith("\n".join(lines[1:]))
        older = summary.splitlines()[-len(lines)]
        assert tk.message_tokens(summary_message("\n".join([CUT_MARK, older, *lines[1:]]))) > room
    else:  # not even the last line fits: its last tokens
        assert summary.endswith(lines[0][len(CUT_MARK) :])


@pytest.mark.parametrize("budget", [60, 120, 250, 700])
def test_a_summary_longer_than_the_budget_is_cut_and_the_newest_messages_keep_their_room(budget):
    # The demo case: a summary written for the app's 8000 tokens, a request for 120.
    items, events = session(30)
    summary = summary_lines(200)
    assert tk.message_tokens(summary_message(summary)) > 5 * budget
    ctx = assemble(history=items, events=events, strategy=Strategy(budget=budget), summary=summary)
    assert ctx.tokens.total <= budget and not ctx.over_budget
    assert ctx.summary_cut and "summary was cut" in ctx.note and ctx.to_memq()["summary_cut"]
    recent = sum(it.tokens for it in items[-3:])
    if recent + tk.REPLY_PRIMING <= budget:  # min_recent 3 fit: they are kept
        assert [it.seq for it in ctx.window][-3:] == [28, 29, 30]
    if ctx.summary:
        assert ctx.summary.startswith(CUT_MARK) and summary.endswith(
            ctx.summary.splitlines()[-1].removeprefix(CUT_MARK)
        )
    check_total(ctx)


def test_a_summary_that_fits_is_kept_whole_and_all_never_cuts():
    items, events = session(5)
    ctx = assemble(history=items, events=events, strategy=Strategy(budget=8000), summary=summary_lines(20))
    assert not ctx.summary_cut and ctx.note is None and ctx.summary == summary_lines(20)
    everything = assemble(
        history=items, events=events, strategy=Strategy(kind="all", budget=50), summary=summary_lines(20)
    )
    assert not everything.summary_cut and everything.over_budget and everything.summary == summary_lines(20)


@pytest.mark.parametrize("kind", ["summary_buffer", "token_window", "all"])
def test_one_memory_recalled_from_two_sessions_is_listed_once(kind):
    """Issue 40: the same words told in two sessions were listed twice,
    spending the budget twice. The best-scored (first) stays, with its date."""
    items, events = session(4)
    recalled = [
        (200, text_event("user", "I am vegetarian.", ts=1_700_000_000.0), 0),  # best scored
        (300, text_event("user", "I live in Lisbon.", ts=1_700_000_000.0), 0),
        (400, text_event("user", "I  am Vegetarian.", ts=1_710_000_000.0), 0),  # another session, same words
        # another speaker: a memory of its own
        (500, {**text_event("assistant", "I am vegetarian.", ts=1_710_000_000.0), "author": "assistant"}, 0),
    ]
    ctx = assemble(history=items, events=events, strategy=Strategy(kind=kind), recalled=recalled)
    block = ctx.to_openai()[0]["content"]
    assert block.startswith(RECALL_HEADER)
    lines = block.splitlines()[1:]
    assert lines == [
        "- [2023-11-14, user] I am vegetarian.",
        "- [2023-11-14, user] I live in Lisbon.",
        "- [2024-03-09, assistant] I am vegetarian.",
    ]
    check_total(ctx)


def test_known_facts_follow_the_instruction_and_are_counted_exactly():
    items, events = session(6)
    recalled = [(100, text_event("user", "I live in Lisbon.", ts=1_700_000_000.0), 9)]
    known = [("a" * 32, "The user lives in Lisbon."), ("b" * 32, "The user likes tea.")]
    ctx = assemble(
        history=items,
        events=events,
        strategy=Strategy(),
        recalled=recalled,
        instruction="You are terse.",
        known=known,
        known_limit=5,
    )
    msgs = ctx.to_openai()
    assert msgs[0]["content"] == "You are terse."
    assert msgs[1] == {
        "role": "system",
        "content": f"{KNOWN_HEADER}\n- The user lives in Lisbon.\n- The user likes tea.",
    }
    assert msgs[2]["content"].startswith(RECALL_HEADER)
    assert ctx.tokens.known == tk.message_tokens(msgs[1]) and ctx.known == tuple(known)
    assert ctx.to_memq()["known"] == [{"id": i, "statement": s} for i, s in known]
    check_total(ctx)
    none = assemble(history=items, events=events, strategy=Strategy(), known=known, known_limit=0)
    assert none.known == () and none.tokens.known == 0 and KNOWN_HEADER not in str(none.to_openai())


def test_known_facts_never_crowd_out_min_recent_and_respect_the_limit():
    items, events = session(30)
    last3 = sum(it.tokens for it in items[-3:])
    known = [(f"{i:032x}", f"The user has fact number {i}.") for i in range(20)]
    strategy = Strategy(budget=last3 + 3 + 40, min_recent=3)
    ctx = assemble(history=items, events=events, strategy=strategy, known=known, known_limit=20)
    assert [it.seq for it in ctx.window][-3:] == [28, 29, 30]
    assert 0 < len(ctx.known) < 20 and ctx.tokens.total <= strategy.budget  # as many as fit beside them
    check_total(ctx)
    few = assemble(history=items, events=events, strategy=Strategy(budget=4000), known=known, known_limit=3)
    assert [i for i, _ in few.known] == [k for k, _ in known[:3]]


def test_pick_known_skips_a_fact_too_long_for_shorter_ones_after_it():
    long = ("l" * 32, "The user said " + "very " * 200 + "much.")
    short = [("s" * 32, "The user likes tea."), ("t" * 32, "The user lives in Oslo.")]
    chosen, tokens = pick_known([long, *short], limit=5, room=60, model=None)
    assert chosen == tuple(short) and tokens == tk.message_tokens(known_message([s for _, s in short]))
    assert pick_known([long, *short], limit=5, room=3, model=None) == ((), 0)  # not even the header fits
    assert pick_known(short, limit=1, room=1000, model=None)[0] == (short[0],)
