"""What an agent sends to its model (docs/design.md, Working memory and recall): instruction,
what is known about the user (facts), recalled long-term memories, the
latest summary and the recent window, within one token budget, with the
exact count of each part.

Pure: the caller loads events, counts and the summary; :func:`assemble`
decides and :class:`Context` renders, as memq's JSON or as OpenAI chat
messages. ``Context.tokens.total == count_messages(context.to_openai())``
exactly, provided each history :class:`Item` was counted with the same model
(:func:`item_from_event` does that).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from memq.workers.memory import tokens as tk
from memq.workers.memory.strategies import Item, Selection, Strategy, preserved, select

RECALL_HEADER = "Memories recalled from earlier conversations (may be relevant):"
KNOWN_HEADER = "What is known about the user:"
SUMMARY_HEADER = "Summary of the conversation so far:"


def item_from_event(seq: int, event: Mapping[str, Any], *, model: str | None = None, tokens: int | None = None) -> Item:
    """The :class:`Item` of one event.

    Parameters:
        seq: the event's stream sequence.
        event: the event as a dict (``Event.model_dump()``).
        model: the model to count for (default None: ``cl100k_base``).
        tokens: the stored count, if the event was counted at persist time;
            counted here otherwise.
    """
    message = event.get("message") or {}
    calls, results = tk.tool_ids(event)
    return Item(
        seq=seq,
        role=message.get("role", ""),
        tokens=tk.count_event(event, model) if tokens is None else tokens,
        call_ids=calls,
        result_ids=results,
    )


def summary_message(summary: str) -> dict[str, str]:
    """The system message that carries a checkpoint summary."""
    return {"role": "system", "content": f"{SUMMARY_HEADER}\n{summary}"}


CUT_MARK = "…"  # first line of a summary cut to fit: the model sees that it starts mid-way


def fit_summary(summary: str, room: int, model: str | None = None) -> str | None:
    """``summary`` whose summary message fits ``room`` tokens: whole if it
    fits, else its newest lines (a summary is written oldest first) under a
    :data:`CUT_MARK` line, else the last tokens of its last line; None when
    not even the header fits.

    Parameters:
        summary: the checkpoint summary.
        room: tokens its message may take.
        model: the model to count for (default None: ``cl100k_base``).
    """
    if tk.message_tokens(summary_message(summary), model) <= room:
        return summary

    def cost(text: str) -> int:
        return tk.message_tokens(summary_message(text), model)

    lines = summary.splitlines()
    # Per-line counts pick the tail in one pass; tokens may merge across a
    # newline, so the exact count of the joined text has the last word.
    free = room - cost(CUT_MARK)
    start = len(lines)
    while start > 0 and free - (tk.count_text(lines[start - 1], model) + 1) >= 0:
        free -= tk.count_text(lines[start - 1], model) + 1
        start -= 1
    while start < len(lines) and cost("\n".join([CUT_MARK, *lines[start:]])) > room:
        start += 1
    if start < len(lines):
        return "\n".join([CUT_MARK, *lines[start:]])
    ids = tk.encoding_for(model).encode_ordinary(lines[-1] if lines else summary)
    for n in range(min(len(ids), max(0, room - cost(CUT_MARK))), 0, -1):
        text = CUT_MARK + tk.encoding_for(model).decode(ids[-n:])
        if cost(text) <= room:
            return text
    return None


def recall_line(event: Mapping[str, Any]) -> str:
    """One recalled event as ``- [date, speaker] text``: the date helps with
    "when did..." questions, the speaker (the event's ``author``, else its
    role) with "what did X..." ones, as a memory out of its conversation does
    not say who spoke."""
    speaker = event.get("author") or (event.get("message") or {}).get("role", "")
    date = tk.event_time(event)
    label = f"{date}, {speaker}" if date else speaker
    return f"- [{label}] {tk.event_text(event)}"


def recall_message(recalled: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, str]:
    """One system message listing recalled events, one :func:`recall_line` each."""
    lines = [RECALL_HEADER, *(recall_line(event) for _seq, event in recalled)]
    return {"role": "system", "content": "\n".join(lines)}


def known_message(statements: Sequence[str]) -> dict[str, str]:
    """One system message listing facts about the user, one ``- statement`` line each."""
    return {"role": "system", "content": "\n".join([KNOWN_HEADER, *(f"- {s}" for s in statements)])}


def pick_known(
    known: Sequence[tuple[str, str]], *, limit: int, room: int, model: str | None
) -> tuple[tuple[tuple[str, str], ...], int]:
    """The first ``limit`` of ``known`` (``(id, statement)``, best first) whose
    block (:func:`known_message`) fits ``room`` tokens, and the block's tokens
    (0: none shown). A fact that does not fit is skipped for shorter ones
    after it; the block is counted whole, as rendered, and trimmed from the
    end in the rare case the lines' sum was low."""
    estimate = tk.message_tokens(known_message(()), model)
    if limit <= 0 or not known or estimate > room:
        return (), 0
    chosen: list[tuple[str, str]] = []
    for fact_id, statement in known:
        if len(chosen) >= limit:
            break
        cost = tk.count_text(f"- {statement}\n", model)
        if estimate + cost <= room:
            chosen.append((fact_id, statement))
            estimate += cost
    while chosen:
        tokens = tk.message_tokens(known_message([s for _, s in chosen]), model)
        if tokens <= room:
            return tuple(chosen), tokens
        chosen.pop()
    return (), 0


@dataclass(frozen=True)
class TokenCounts:
    """Exact tokens of each part; ``total`` adds OpenAI's 3 reply-priming tokens."""

    instruction: int = 0
    recalled: int = 0
    summary: int = 0
    window: int = 0
    total: int = tk.REPLY_PRIMING
    known: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "instruction": self.instruction,
            "known": self.known,
            "recalled": self.recalled,
            "summary": self.summary,
            "window": self.window,
            "total": self.total,
        }


@dataclass(frozen=True)
class Context:
    """An assembled model context. Build with :func:`assemble`.

    Attributes:
        instruction: the (rendered) system instruction, or None.
        known: ``(fact id, statement)`` of the facts about the user shown.
        recalled: ``(seq, event)`` of the recalled memories shown.
        summary: the checkpoint summary, or None.
        window: the kept history items, in order.
        events: the events by seq (at least those in ``window``).
        tokens: per-part :class:`TokenCounts`.
        strategy: the strategy applied.
        model: the model counted for.
        needs_summary / summarize_up_to: summary_buffer's request to the
            summarizer (see :class:`~memq.workers.memory.strategies.Selection`),
            judged without recalled memories, which vary per query.
    """

    instruction: str | None
    recalled: tuple[tuple[int, Mapping[str, Any]], ...]
    summary: str | None
    window: tuple[Item, ...]
    events: Mapping[int, Mapping[str, Any]]
    tokens: TokenCounts
    strategy: Strategy
    model: str | None = None
    needs_summary: bool = False
    summarize_up_to: int | None = None
    summary_cut: bool = False
    known: tuple[tuple[str, str], ...] = ()  # (fact id, statement) of the facts shown

    @property
    def over_budget(self) -> bool:
        """True when ``total`` exceeds the budget: possible for ``all`` and
        ``buffer_window`` (not token-bounded), or when the instruction alone
        does not fit."""
        return self.tokens.total > self.strategy.budget

    @property
    def budget_note(self) -> str | None:
        """Why the context is over budget, in words for the caller (None when
        it fits): replies carry it in every format, so that an OpenAI-format
        caller learns it as well as one reading memq's format."""
        if not self.over_budget:
            return None
        total, budget, rules = self.tokens.total, self.strategy.budget, self.strategy.rules
        if rules.token_bounded:
            why = "the instruction alone does not fit"
        else:
            why = f"strategy {rules.name} {rules.unbounded_why}; summary_buffer or token_window keep within the budget"
        return f"over budget: {total} tokens for a budget of {budget} ({why})"

    @property
    def note(self) -> str | None:
        """What the caller should know about this context, in words: why it
        is over budget (:attr:`budget_note`), or that the summary was cut to
        fit; None when neither."""
        if self.over_budget:
            return self.budget_note
        if self.summary_cut:
            return f"the checkpoint summary was cut to its newest part to fit the budget of {self.strategy.budget}"
        return None

    def to_openai(self) -> list[dict[str, Any]]:
        """OpenAI chat messages: system instruction, system facts block, system recall block,
        system summary, then the window's events (see
        :func:`~memq.workers.memory.tokens.event_messages`)."""
        out: list[dict[str, Any]] = []
        if self.instruction:
            out.append({"role": "system", "content": self.instruction})
        if self.known:
            out.append(known_message([s for _, s in self.known]))
        if self.recalled:
            out.append(recall_message(self.recalled))
        if self.summary:
            out.append(summary_message(self.summary))
        for item in self.window:
            out.extend(tk.event_messages(self.events[item.seq]))
        return out

    def to_memq(self) -> dict[str, Any]:
        """memq's own JSON-able form: each part with its events and counts."""
        choice = tk.choose_encoding(self.model)
        return {
            "model": self.model,
            "encoding": choice.used,
            "approximate": choice.approximate,
            "strategy": self.strategy.to_dict(),
            "budget": self.strategy.budget,
            "over_budget": self.over_budget,
            "note": self.note,
            "summary_cut": self.summary_cut,
            "tokens": self.tokens.to_dict(),
            "instruction": self.instruction,
            "known": [{"id": fact_id, "statement": statement} for fact_id, statement in self.known],
            "recalled": [{"seq": seq, "event": dict(event)} for seq, event in self.recalled],
            "summary": self.summary,
            "window": [{"seq": it.seq, "tokens": it.tokens, "event": dict(self.events[it.seq])} for it in self.window],
            "needs_summary": self.needs_summary,
            "summarize_up_to": self.summarize_up_to,
        }


class _RecallLines:
    """Each recalled memory's line and its tokens, rendered and counted once
    per assembly (recall is picked more than once as the window settles)."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self._lines: dict[int, tuple[str, int]] = {}

    @cached_property
    def header(self) -> int:
        return tk.message_tokens(recall_message(()), self.model)

    def line(self, seq: int, event: Mapping[str, Any]) -> tuple[str, int]:
        got = self._lines.get(seq)
        if got is None:
            text = recall_line(event)
            # with its newline, which often merges with the line's last character
            got = self._lines[seq] = (text, tk.count_text(text + "\n", self.model))
        return got

    def block_tokens(self, seqs: Sequence[int]) -> int:
        """The exact tokens of :func:`recall_message` of these (seen) memories."""
        content = "\n".join([RECALL_HEADER, *(self._lines[seq][0] for seq in seqs)])
        return tk.message_tokens({"role": "system", "content": content}, self.model)


def _content_key(event: Mapping[str, Any]) -> tuple[str, str]:
    """What makes two recalled memories the same one: who said it and what
    (case and spacing aside), not where: the same words in two sessions
    (a user's fact told twice) are one memory to the model."""
    speaker = event.get("author") or (event.get("message") or {}).get("role", "")
    return str(speaker), " ".join(tk.event_text(event).split()).casefold()


def _pick_recalled(
    recalled: Sequence[tuple[int, Mapping[str, Any], int]],
    *,
    exclude: set[int],
    limit: int,
    room: int,
    lines: _RecallLines,
) -> tuple[tuple[tuple[int, Mapping[str, Any]], ...], int]:
    """Recalled memories in the given (relevance) order, skipping ``exclude``
    and repeats (the same seq, or the same content: :func:`_content_key`,
    whose best-scored comes first and stays), at most ``limit``, while the
    block fits ``room`` tokens."""
    if limit <= 0 or room <= 0:
        return (), 0
    # Lines are counted one by one (re-counting the growing block for each
    # candidate costs O(n^2) tokens: milliseconds for 20 memories); then the
    # block is counted whole, as rendered, since tokens may merge across
    # lines, and trimmed from the end in the rare case the sum was too low.
    estimate = lines.header
    chosen: list[tuple[int, Mapping[str, Any]]] = []
    seen: set[int] = set()
    said: set[tuple[str, str]] = set()
    for seq, event, _stored in recalled:
        if len(chosen) >= limit:
            break
        if seq in exclude or seq in seen or (content := _content_key(event)) in said:
            continue
        seen.add(seq)
        said.add(content)
        cost = lines.line(seq, event)[1]
        if estimate + cost <= room:
            chosen.append((seq, event))
            estimate += cost
    while chosen:
        used = lines.block_tokens([seq for seq, _ in chosen])
        if used <= room:
            return tuple(chosen), used
        chosen.pop()
    return (), 0


def assemble(
    *,
    history: Sequence[Item],
    events: Mapping[int, Mapping[str, Any]],
    strategy: Strategy,
    summary: str | None = None,
    recalled: Sequence[tuple[int, Mapping[str, Any], int]] = (),
    recall_limit: int = 20,
    instruction: str | None = None,
    model: str | None = None,
    known: Sequence[tuple[str, str]] = (),
    known_limit: int = 0,
) -> Context:
    """Assemble a model context.

    Parameters:
        history: the session's items in stream order (for ``summary_buffer``,
            only those after the latest checkpoint), counted for ``model``.
        events: events by seq, covering ``history``.
        strategy: the working-memory :class:`Strategy`.
        summary: the latest checkpoint summary (default None).
        recalled: ``(seq, event, tokens)`` from long-term recall, most
            relevant first (default none). ``tokens`` is not needed:
            the recall block is re-counted as rendered.
        recall_limit: at most this many memories (default 20, as a context
            request's).
        instruction: the rendered system instruction (default None).
        model: the model to count for (default None: ``cl100k_base``).
        known: ``(fact id, statement)`` of facts about the user, most
            relevant first (default none).
        known_limit: at most this many facts (default 0: none).

    Order and budget: instruction, known facts, recalled memories, summary,
    recent window. Instruction and the 3 reply-priming tokens come first.
    Facts come next, as a part of the head every later part is fitted
    after, but never in the room of the ``min_recent``/``preserve_recent``
    messages (:func:`pick_known`): a fact states in a line what recall would
    need several turns for, so it goes before recall and the summary. ``summary_buffer``
    with recalled memories then gives them up to ``strategy.recall_share`` of
    the rest, but never the room of the ``min_recent`` messages: what the
    question needs from long ago before what every question shares. For
    ``summary_buffer`` and ``token_window`` a summary that would not leave the
    newest messages (and that recall share) their room is cut to its newest
    part (:func:`fit_summary`, ``summary_cut``). Then:

    - ``summary_buffer`` keeps every event after the checkpoint that fits
      (docs/design.md, Working memory and recall) next to the recall share;
      recalled memories get what is left (more of them, up to ``recall_limit``).
    - ``token_window`` reserves recalled memories before choosing the window
      (the window is selected with ``reserved`` = instruction + summary +
      recalled + priming), but never lets them crowd out ``preserve_recent``.
    - ``all`` and ``buffer_window`` do not trim by tokens; recalled
      memories get what is left of the budget.

    Recalled memories whose seq is in the final window are skipped.
    """
    instruction = instruction or None
    summary = summary or None
    instruction_tokens = tk.message_tokens({"role": "system", "content": instruction}, model) if instruction else 0
    fixed = instruction_tokens + tk.REPLY_PRIMING
    lines = _RecallLines(model)
    keep = preserved(history, strategy)
    recent = sum(it.tokens for it in keep)
    recent = recent if fixed + recent <= strategy.budget else 0  # they do not fit at all: no room to leave them
    shown, known_tokens = pick_known(known, limit=known_limit, room=strategy.budget - fixed - recent, model=model)
    fixed += known_tokens
    # summary_buffer's recall share: memories this question needs before the
    # summary and the older messages, which every question shares.
    reserved_recall: tuple[tuple[int, Mapping[str, Any]], ...] = ()
    reserve_tokens = 0
    if strategy.rules.recall_room == "share" and strategy.recall_share > 0 and recalled and recall_limit > 0:
        share = math.floor(strategy.recall_share * max(0, strategy.budget - fixed))
        room = max(0, min(share, strategy.budget - fixed - recent))
        reserved_recall, reserve_tokens = _pick_recalled(
            recalled, exclude={it.seq for it in keep}, limit=recall_limit, room=room, lines=lines
        )
    summary_cut = False
    if summary and strategy.token_bounded:
        # A summary written for a larger budget (the app's) may not fit this
        # request's: keep its newest part, and leave the newest messages
        # (min_recent / preserve_recent) and the recall share their room
        # whenever they fit at all.
        room = strategy.budget - fixed - recent - reserve_tokens
        fitted = fit_summary(summary, room, model)
        summary_cut, summary = fitted != summary, fitted
    summary_tokens = tk.message_tokens(summary_message(summary), model) if summary else 0
    base = instruction_tokens + known_tokens + summary_tokens + tk.REPLY_PRIMING
    budget = strategy.budget

    # Summarizer trigger, judged on what every query of this session carries.
    base_selection = select(history, strategy, reserved=base)

    window: Selection = base_selection
    chosen: tuple[tuple[int, Mapping[str, Any]], ...] = ()
    recall_tokens = 0
    recalling = bool(recalled) and recall_limit > 0  # else the window is base_selection
    if recalling and strategy.rules.recall_room == "before_older":
        # Recall may displace older messages but not preserve_recent; if even
        # those do not fit, there is no room for recall at all.
        keep_tokens = sum(it.tokens for it in preserved(history, strategy))
        room = max(0, budget - base - keep_tokens)
        # The window shrinks as recall grows, which may un-keep an item that
        # recall skipped as "already in the window": iterate a few times.
        for _ in range(3):
            exclude = {it.seq for it in window.items}
            chosen, recall_tokens = _pick_recalled(
                recalled, exclude=exclude, limit=recall_limit, room=room, lines=lines
            )
            nxt = select(history, strategy, reserved=base + recall_tokens)
            if nxt.items == window.items:
                break
            window = nxt
        in_window = {it.seq for it in window.items}
        if any(seq in in_window for seq, _ in chosen):
            chosen = tuple((s, e) for s, e in chosen if s not in in_window)
            recall_tokens = tk.message_tokens(recall_message(chosen), model) if chosen else 0
    elif recalling:
        if reserve_tokens:
            # the window keeps what the recall share leaves; recall then takes
            # whatever the window does not use (at least its share)
            window = select(history, strategy, reserved=base + reserve_tokens)
        room = max(0, budget - base - window.tokens)
        exclude = {it.seq for it in window.items}
        chosen, recall_tokens = _pick_recalled(recalled, exclude=exclude, limit=recall_limit, room=room, lines=lines)

    counts = TokenCounts(
        instruction=instruction_tokens,
        known=known_tokens,
        recalled=recall_tokens,
        summary=summary_tokens,
        window=window.tokens,
        total=base + recall_tokens + window.tokens,
    )
    return Context(
        instruction=instruction,
        recalled=chosen,
        summary=summary,
        window=window.items,
        events=events,
        tokens=counts,
        strategy=strategy,
        model=model,
        needs_summary=base_selection.needs_summary,
        summarize_up_to=base_selection.summarize_up_to,
        summary_cut=summary_cut,
        known=shown,
    )
