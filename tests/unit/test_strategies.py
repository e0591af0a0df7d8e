"""Working-memory strategies: hypothesis properties over random sessions
(with tool calls and results) and the documented behaviours of Hector and
Synapse."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.workers.memory.strategies import MIN_SUMMARY_TOKENS, Item, Selection, Strategy, fold, preserved, select

# --- generators ---------------------------------------------------------------


@st.composite
def sessions(draw, max_items: int = 40) -> list[Item]:
    """Items in stream order: plain messages, tool calls (one or several per
    event), results answering open calls (one or several per event, possibly
    much later, as user or tool role), orphan results, unanswered calls."""
    n = draw(st.integers(0, max_items))
    items: list[Item] = []
    open_calls: list[str] = []
    next_id = 0
    for seq in range(1, n + 1):
        tokens = draw(st.integers(0, 400))
        action = draw(st.sampled_from(["user", "assistant", "system", "call", "result", "result", "orphan"]))
        if action == "call":
            k = draw(st.integers(1, 3))
            ids = [f"c{next_id + i}" for i in range(k)]
            next_id += k
            open_calls.extend(ids)
            # sometimes the same event also answers one of its own calls
            own = frozenset(ids[:1]) if draw(st.booleans()) and draw(st.booleans()) else frozenset()
            items.append(Item(seq, "assistant", tokens, call_ids=frozenset(ids), result_ids=own))
        elif action == "result" and open_calls:
            picked = draw(st.lists(st.sampled_from(open_calls), min_size=1, max_size=3, unique=True))
            for cid in picked:
                if draw(st.booleans()):
                    open_calls.remove(cid)  # else a later event answers it again (several results)
            role = draw(st.sampled_from(["tool", "user"]))
            items.append(Item(seq, role, tokens, result_ids=frozenset(picked)))
        elif action == "orphan":
            items.append(Item(seq, "tool", tokens, result_ids=frozenset({f"gone{seq}"})))
        else:
            role = action if action in ("user", "assistant", "system") else "user"
            items.append(Item(seq, role, tokens))
    return items


@st.composite
def strategies_(draw) -> Strategy:
    kind = draw(st.sampled_from(["all", "buffer_window", "token_window", "summary_buffer"]))
    threshold = draw(st.sampled_from([0.5, 0.7, 0.85, 1.0]))
    target = draw(st.sampled_from([t for t in (0.3, 0.5, 0.7, 0.85, 1.0) if t <= threshold]))
    return Strategy(
        kind=kind,
        window=draw(st.integers(1, 30)),
        turns=draw(st.none() | st.integers(1, 6)),
        budget=draw(st.integers(0, 6000)),
        preserve_recent=draw(st.integers(0, 8)),
        threshold=threshold,
        target=target,
        min_recent=draw(st.integers(0, 6)),
    )


# --- an independent reference for "does this cut split a tool unit" ------------


def splits_a_unit(items: list[Item], cut: int) -> bool:
    """Brute force, independent of strategies.valid_cuts: is a call left out
    while one of its results is kept? (Results come after their calls, so a
    suffix cannot do the reverse.)"""
    dropped_calls = {c for it in items[:cut] for c in it.call_ids}
    kept_results = {r for it in items[cut:] for r in it.result_ids}
    return bool(dropped_calls & kept_results)


def cut_of(items: list[Item], sel: Selection) -> int:
    return len(items) - len(sel.items)


def frac(budget: int, f: float) -> int:
    return math.floor(budget * f + 1e-9)


# --- properties -----------------------------------------------------------------

PROPS = settings(max_examples=400, deadline=None)


@PROPS
@given(items=sessions(), strategy=strategies_(), reserved=st.integers(0, 7000))
def test_suffix_ordered_and_deterministic(items, strategy, reserved):
    a = select(items, strategy, reserved=reserved)
    b = select(list(items), strategy, reserved=reserved)
    assert a == b
    cut = cut_of(items, a)
    assert a.items == tuple(items[cut:])  # a suffix, in stream order
    assert a.tokens == sum(it.tokens for it in a.items)


@PROPS
@given(items=sessions(), strategy=strategies_(), reserved=st.integers(0, 7000))
def test_never_over_budget(items, strategy, reserved):
    sel = select(items, strategy, reserved=reserved)
    if strategy.token_bounded:
        assert sel.tokens + reserved <= strategy.budget or not sel.items


@PROPS
@given(items=sessions(), strategy=strategies_(), reserved=st.integers(0, 7000))
def test_never_separates_a_tool_call_from_its_result(items, strategy, reserved):
    sel = select(items, strategy, reserved=reserved)
    assert not splits_a_unit(items, cut_of(items, sel))
    if sel.summarize_up_to is not None:
        fold = next(i for i, it in enumerate(items) if it.seq == sel.summarize_up_to) + 1
        assert not splits_a_unit(items, fold)


@PROPS
@given(items=sessions(), strategy=strategies_(), reserved=st.integers(0, 7000))
def test_keeps_the_recent_messages_whenever_they_fit(items, strategy, reserved):
    sel = select(items, strategy, reserved=reserved)
    kept = set(sel.items)
    n = len(items)
    if strategy.kind in ("token_window", "summary_buffer"):
        k = strategy.keep_recent
        recent = items[max(0, n - k) :]
        must = preserved(items, strategy)
        assert set(recent) <= set(must)
        if sum(it.tokens for it in must) + reserved <= strategy.budget:
            assert set(must) <= kept
    elif strategy.kind == "buffer_window":
        if strategy.turns is None:
            assert set(items[max(0, n - strategy.window) :]) <= kept
        else:
            starts = [i for i, it in enumerate(items) if it.role == "user" and not it.result_ids and not it.call_ids]
            start = starts[-strategy.turns] if len(starts) >= strategy.turns else 0
            assert set(items[start:]) <= kept


@PROPS
@given(items=sessions(), strategy=strategies_(), reserved=st.integers(0, 7000))
def test_token_windows_keep_as_much_as_fits(items, strategy, reserved):
    # maximal: starting one whole unit earlier would not fit
    if not strategy.token_bounded:
        return
    sel = select(items, strategy, reserved=reserved)
    cut = cut_of(items, sel)
    for c in range(cut):
        if not splits_a_unit(items, c):
            assert sum(it.tokens for it in items[c:]) + reserved > strategy.budget


@PROPS
@given(items=sessions(), strategy=strategies_(), reserved=st.integers(0, 7000))
def test_windows_do_not_keep_more_than_needed(items, strategy, reserved):
    # buffer windows only grow past `window` / the turn start to keep a unit whole
    if strategy.kind != "buffer_window":
        return
    sel = select(items, strategy, reserved=reserved)
    n, cut = len(items), cut_of(items, sel)
    if strategy.turns is None:
        target = max(0, n - strategy.window)
    else:
        starts = [i for i, it in enumerate(items) if it.role == "user" and not it.result_ids and not it.call_ids]
        target = starts[-strategy.turns] if len(starts) >= strategy.turns else 0
    assert cut <= target
    for c in range(cut + 1, target + 1):
        assert splits_a_unit(items, c)


@PROPS
@given(items=sessions(), strategy=strategies_())
def test_all_keeps_everything(items, strategy):
    sel = select(items, Strategy(**{**strategy.to_dict(), "kind": "all"}))
    assert sel.items == tuple(items)
    assert not sel.needs_summary and sel.summarize_up_to is None


@PROPS
@given(items=sessions(), strategy=strategies_(), reserved=st.integers(0, 7000))
def test_summary_buffer_requests(items, strategy, reserved):
    strategy = Strategy(**{**strategy.to_dict(), "kind": "summary_buffer"})
    sel = select(items, strategy, reserved=reserved)
    total = sum(it.tokens for it in items)
    if total + reserved <= strategy.budget:
        assert sel.items == tuple(items)  # every event after the checkpoint
    if total + reserved <= frac(strategy.budget, strategy.threshold):
        assert not sel.needs_summary
    assert sel.needs_summary == (sel.summarize_up_to is not None)
    if sel.needs_summary:
        fold = next(i for i, it in enumerate(items) if it.seq == sel.summarize_up_to) + 1
        rest = items[fold:]
        assert fold >= 1
        assert len(rest) >= min(strategy.min_recent, len(items))  # min_recent never folded
        fits_target = sum(it.tokens for it in rest) + reserved <= frac(strategy.budget, strategy.target)
        # either the target is reached, or folding more would eat into min_recent
        assert fits_target or all(
            splits_a_unit(items, c) for c in range(fold + 1, len(items) - strategy.min_recent + 1)
        )
        # and not more than needed: folding one unit less misses the target
        for c in range(1, fold):
            if not splits_a_unit(items, c):
                assert sum(it.tokens for it in items[c:]) + reserved > frac(strategy.budget, strategy.target)
    elif total + reserved > frac(strategy.budget, strategy.threshold):
        # over the threshold but nothing may be folded: min_recent covers it all
        from memq.workers.memory.strategies import recent_cut

        assert recent_cut(items, strategy.min_recent) == 0


# --- validation -----------------------------------------------------------------


def test_defaults_are_hectors():
    s = Strategy()
    # budgeted by default, as Hector v1 and Synapse (docs/design.md, Working memory and recall)
    assert (s.kind, s.window, s.budget, s.threshold, s.target, s.preserve_recent, s.min_recent) == (
        "summary_buffer",
        20,
        8000,
        0.85,
        0.7,
        5,
        3,
    )
    assert s.turns is None


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "fifo"},
        {"window": 0},
        {"turns": 0},
        {"budget": -1},
        {"preserve_recent": -1},
        {"min_recent": -1},
        {"threshold": 0},
        {"threshold": 1.5},
        {"target": 0.9, "threshold": 0.8},
    ],
)
def test_invalid_settings_are_refused(bad):
    with pytest.raises(ValueError):
        Strategy(**bad)


def test_from_dict():
    s = Strategy.from_dict({"kind": "token_window", "budget": 4000})
    assert s == Strategy(kind="token_window", budget=4000)
    assert Strategy.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="unknown strategy settings: windw"):
        Strategy.from_dict({"windw": 3})


def test_none_is_hectors_name_for_all():
    assert Strategy(kind="none") == Strategy(kind="all")
    assert Strategy.from_dict({"kind": "none", "budget": 50}).to_dict()["kind"] == "all"
    items = chat(5, tokens=100)
    assert select(items, Strategy(kind="none", budget=50)) == select(items, Strategy(kind="all", budget=50))
    with pytest.raises(ValueError, match="none"):  # the refusal lists the alias too
        Strategy(kind="fifo")


def test_the_default_strategy_fits_the_budget_before_any_summary():
    # No checkpoint yet and over the budget: the oldest go, the newest stay,
    # and a tool result never stays without its call.
    items = chat(40, tokens=100) + [
        Item(41, "assistant", 150, call_ids=frozenset({"c"})),
        Item(42, "tool", 150, result_ids=frozenset({"c"})),
        Item(43, "assistant", 100),
    ]
    sel = select(items, Strategy(budget=420))
    assert sel.tokens <= 420 and seqs(sel) == [41, 42, 43]
    assert sel.needs_summary  # and the summarizer is asked to fold the rest
    sel = select(items, Strategy(budget=350))  # the unit does not fit beside 43: both go
    assert seqs(sel) == [43]


# --- documented behaviours ------------------------------------------------------


def chat(n: int, tokens: int = 10, start: int = 1) -> list[Item]:
    """Alternating user/assistant messages."""
    return [Item(s, "user" if (s - start) % 2 == 0 else "assistant", tokens) for s in range(start, start + n)]


def seqs(sel: Selection) -> list[int]:
    return [it.seq for it in sel.items]


def test_hector_buffer_window_keeps_the_last_20():
    # pkg/memory/buffer_window.go: events[len(events)-windowSize:], default 20
    items = chat(30)
    assert seqs(select(items, Strategy(kind="buffer_window"))) == list(range(11, 31))
    assert seqs(select(chat(12), Strategy(kind="buffer_window"))) == list(range(1, 13))


def test_synapse_window_by_messages():
    # synaptic-memory tests/window_edge.rs: window 2 over a,b,c,d keeps c,d;
    # window 1 over three messages keeps the last
    assert seqs(select(chat(4), Strategy(kind="buffer_window", window=2))) == [3, 4]
    assert seqs(select(chat(3), Strategy(kind="buffer_window", window=1))) == [3]


def test_synapse_window_by_turns():
    # Synapse's docs: "keeps only the last K message pairs (human + AI)",
    # "Window | Last K turns". Turns here: a user message and all after it.
    items = [
        Item(1, "user", 5),
        Item(2, "assistant", 5),
        Item(3, "user", 5),
        Item(4, "assistant", 5, call_ids=frozenset({"t1"})),
        Item(5, "tool", 5, result_ids=frozenset({"t1"})),
        Item(6, "assistant", 5),
        Item(7, "user", 5),
        Item(8, "assistant", 5),
    ]
    assert seqs(select(items, Strategy(kind="buffer_window", turns=1))) == [7, 8]
    assert seqs(select(items, Strategy(kind="buffer_window", turns=2))) == [3, 4, 5, 6, 7, 8]
    assert seqs(select(items, Strategy(kind="buffer_window", turns=9))) == list(range(1, 9))
    # an ADK-style function response (role user, with a result) is not a turn
    adk = [*items[:4], Item(5, "user", 5, result_ids=frozenset({"t1"})), *items[5:]]
    assert seqs(select(adk, Strategy(kind="buffer_window", turns=2))) == [3, 4, 5, 6, 7, 8]


def test_hector_token_window_within_8000():
    # pkg/memory/token_window.go: newest first within the budget (8000)
    items = chat(12, tokens=1000)
    sel = select(items, Strategy(kind="token_window"))
    assert seqs(sel) == list(range(5, 13)) and sel.tokens == 8000


def test_preserve_recent_never_breaks_the_budget():
    # Hector keeps preserve_recent (5) "even if they exceed the budget
    # slightly": 5 x 3000 = 15000 tokens against 8000. memq keeps the longest
    # suffix that fits instead.
    items = chat(10, tokens=3000)
    hector_keeps = items[-5:]
    assert sum(it.tokens for it in hector_keeps) > 8000
    sel = select(items, Strategy(kind="token_window"))
    assert seqs(sel) == [9, 10] and sel.tokens == 6000
    # reserved tokens (instruction, summary...) come out of the same budget
    assert seqs(select(items, Strategy(kind="token_window"), reserved=2500)) == [10]
    assert select(items, Strategy(kind="token_window"), reserved=8001).items == ()


def test_a_window_never_cuts_between_call_and_result():
    items = [
        *chat(4),
        Item(5, "assistant", 10, call_ids=frozenset({"a", "b"})),
        Item(6, "tool", 10, result_ids=frozenset({"a"})),
        Item(7, "tool", 10, result_ids=frozenset({"b"})),
        Item(8, "assistant", 10),
    ]
    # last 3 would start at the result of "b": the call is pulled in
    assert seqs(select(items, Strategy(kind="buffer_window", window=3))) == [5, 6, 7, 8]
    # 30 tokens fit 3 items, but that would split the unit: drop it whole
    assert seqs(select(items, Strategy(kind="token_window", budget=30))) == [8]
    assert seqs(select(items, Strategy(kind="token_window", budget=40))) == [5, 6, 7, 8]


def hector_summary_buffer(events: list[Item], budget=8000, threshold=0.85, target=0.7):
    """Hector's summary_buffer (pkg/memory/summary_buffer.go, runner.go), as
    a model: after a turn, if tokens > budget*threshold (and >= 20 messages),
    summarize all but the recent messages that fit target*0.8 (at least 10),
    and append the summary event at the END of the session; before the next
    call FilterEvents starts the window at the last summary event.
    Returns (the next window, the recent messages kept out of the summary)."""

    def within(evs, limit):
        out, used = [], 0
        for ev in reversed(evs):
            if used + ev.tokens > limit:
                break
            out.insert(0, ev)
            used += ev.tokens
        if len(out) < 10 and len(evs) >= 10:
            return evs[-10:]
        return out

    session = list(events)
    recent: list[Item] = []
    if len(session) >= 20 and sum(e.tokens for e in session) > int(budget * threshold):
        recent = within(session, int(int(budget * target) * 0.8))
        summary = Item(max(e.seq for e in session) + 1, "system", 200)  # "Previous conversation summary: ..."
        session.append(summary)  # runner.checkpointAndSummarize: AppendEvent
    last_summary = max((i for i, e in enumerate(session) if e.role == "system"), default=0)
    return within(session[last_summary:], int(budget * target)), recent


def test_hectors_summary_buffer_loses_its_recent_window_and_ours_does_not():
    events = chat(30, tokens=300)  # 9000 tokens > 0.85 x 8000
    hector_window, kept_out_of_summary = hector_summary_buffer(events)
    # Hector: only the summary event is left; the 14 recent messages it chose
    # NOT to summarize are in neither the summary nor the window.
    assert [e.role for e in hector_window] == ["system"]
    assert len(kept_out_of_summary) == 14 and not set(kept_out_of_summary) & set(hector_window)

    ours = select(events, Strategy(kind="summary_buffer"))
    assert ours.needs_summary
    # fold until 0.7 x 8000 = 5600 remains: 18 messages (5400 tokens) stay
    assert ours.summarize_up_to == 12
    # the summarizer writes a checkpoint with up_to_seq=12; the query worker
    # passes only the events after it, and every one of them is kept
    after = [e for e in events if e.seq > ours.summarize_up_to]
    summary_tokens = 200
    nxt = select(after, Strategy(kind="summary_buffer"), reserved=summary_tokens)
    assert seqs(nxt) == list(range(13, 31)) and len(nxt.items) >= 3
    assert not nxt.needs_summary  # 5400 + 200 <= 6800


def test_summary_buffer_keeps_min_recent_verbatim():
    # three huge recent messages: over the threshold, but they are the last
    # min_recent (3) and are never folded; the older ones are
    items = [*chat(4, tokens=300), *chat(3, tokens=2600, start=5)]
    sel = select(items, Strategy(kind="summary_buffer"))
    # folding 5 would reach the 5600 target, but 5 is one of the last three
    assert sel.needs_summary and sel.summarize_up_to == 4
    assert seqs(sel) == [5, 6, 7]  # 7800 fits 8000; with 4 it would be 8100
    only_recent = chat(3, tokens=2600)
    sel = select(only_recent, Strategy(kind="summary_buffer"))
    assert not sel.needs_summary and sel.summarize_up_to is None  # nothing may be folded


def test_summary_buffer_respects_threshold_exactly():
    items = chat(68, tokens=100)  # 6800 = 0.85 x 8000: not above
    assert not select(items, Strategy(kind="summary_buffer")).needs_summary
    assert select(chat(69, tokens=100), Strategy(kind="summary_buffer")).needs_summary
    assert select(items, Strategy(kind="summary_buffer"), reserved=1).needs_summary


def test_empty_history():
    for kind in ("all", "buffer_window", "token_window", "summary_buffer"):
        sel = select([], Strategy(kind=kind))
        assert sel == Selection(items=(), tokens=0)


@PROPS
@given(items=sessions(), strategy=strategies_(), reserved=st.integers(0, 3000))
def test_a_fold_leaves_the_new_summary_room(items, strategy, reserved):
    strategy = Strategy(**{**strategy.to_dict(), "kind": "summary_buffer"})
    plan = fold(items, strategy, reserved=reserved)
    assert (plan is None) == (not select(items, strategy, reserved=reserved).needs_summary)
    if plan is None:
        return
    at = next(i for i, it in enumerate(items) if it.seq == plan.up_to) + 1
    rest = items[at:]
    assert not splits_a_unit(items, at)
    assert len(rest) >= min(strategy.min_recent, len(items))  # min_recent never folded
    goal = frac(strategy.budget, strategy.target)
    assert MIN_SUMMARY_TOKENS <= plan.summary_tokens <= max(MIN_SUMMARY_TOKENS, goal // 2)
    # it folds at least as far as the query worker's request
    assert plan.up_to >= select(items, strategy, reserved=reserved).summarize_up_to


def test_a_fold_after_a_summary_still_has_room_for_the_next():
    events = chat(30, tokens=300)  # 9000 tokens, budget 8000: target 5600
    plan = fold(events, Strategy(kind="summary_buffer"), reserved=0)
    kept = sum(e.tokens for e in events if e.seq > plan.up_to)
    assert kept <= 2800 and plan.summary_tokens == 2800  # half the target each


# --- strategies as types: what a kind does is said once ------------------------


def test_every_kind_the_contract_names_has_its_rules():
    from memq.contracts.vocabulary import STRATEGY_KINDS
    from memq.workers.memory.strategies import RULES

    assert set(RULES) == set(STRATEGY_KINDS)
    assert {k for k, r in RULES.items() if r.from_checkpoint} == {"summary_buffer"}
    assert {k for k, r in RULES.items() if r.token_bounded} == {"token_window", "summary_buffer"}


@settings(max_examples=300, deadline=None)
@given(sessions(), strategies_(), st.integers(0, 500))
def test_needs_from_holds_everything_the_strategy_keeps(items, strategy, reserved):
    """What a backward reader stops at (Strategy.needs_from) is enough: the
    strategy keeps the same window from that suffix as from the whole
    session. Sessions without tool units: a call whose result opens the
    window may lie beyond the margin, which the walk covers heuristically."""
    items = [Item(it.seq, it.role, it.tokens) for it in items]
    start = strategy.needs_from(items, reserved)
    if start is None:
        return
    assert select(items[start:], strategy, reserved=reserved).items == select(items, strategy, reserved=reserved).items


def test_no_module_outside_the_rules_switches_on_a_strategy_name():
    """Readers ask a strategy's rules (token_bounded, from_checkpoint,
    recall_room, needs_from…); a comparison with a kind's name anywhere else
    is how the old four-module switch crept in."""
    import re
    from pathlib import Path

    import memq.workers

    root = Path(memq.workers.__file__).parent
    compare = re.compile(r"""(==|!=|\bin\b)\s*\(?["'](all|buffer_window|token_window|summary_buffer)["']""")
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        if path.name != "strategies.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if compare.search(line)
    ]
    assert found == []


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=30), st.integers(-10, 400), st.data())
def test_the_longest_fitting_cut_is_the_first_valid_cut_that_fits(tokens, limit, data):
    """The bisection over suffix sums agrees with the definition: the
    smallest valid cut whose suffix fits."""
    from memq.workers.memory.strategies import _longest_fitting, _suffix_tokens

    items = [Item(seq=i, role="user", tokens=t) for i, t in enumerate(tokens)]
    sums = _suffix_tokens(items)
    assert sums == [sum(tokens[c:]) for c in range(len(tokens) + 1)]
    valid = data.draw(st.lists(st.booleans(), min_size=len(sums), max_size=len(sums)))
    lo = data.draw(st.integers(0, len(sums)))
    expected = next((c for c in range(lo, len(sums)) if valid[c] and sums[c] <= limit), None)
    assert _longest_fitting(valid, sums, limit, lo) == expected
