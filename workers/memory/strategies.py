"""Working-memory strategies (docs/design.md, Working memory and recall): which recent events a model sees.

Pure functions over already-counted :class:`Item` s (one per event, counted
once at persist time with :func:`memq.workers.memory.tokens.count_event`).

Strategies, after Hector (``pkg/memory``, ``pkg/config/agent.go``
``ContextConfig``, ``docs/guides/agents.md``) and Synapse
(``synaptic-memory``):

``all`` (also spelled ``none``, as in Hector)
    Everything, whatever the budget (Hector's ``strategy: none``, "include all
    history"); a context built with it says when it is over budget.
``buffer_window``
    The last ``window`` messages (Hector default 20), or with ``turns`` set,
    the last ``turns`` user turns with everything after each (Synapse's
    window, whose concept docs speak of "last K turns").
``token_window``
    The newest messages within ``budget`` (Hector default 8000) tokens;
    Hector's ``preserve_recent`` (default 5) is kept when it fits.
``summary_buffer`` (the default, as in Hector v1 and Synapse)
    Given only the events *after* the latest summary checkpoint, keeps the
    newest of them that fit ``budget`` (all of them once a summary has
    folded the rest; until then the oldest are dropped), and asks for a new
    summary once they pass ``threshold`` x ``budget`` (Hector 0.85), telling
    the summarizer how far to fold so that ``target`` x ``budget`` (Hector
    0.7) remains, with at least ``min_recent`` (3, as Hector's docs promise)
    messages verbatim.

Rules that hold for every strategy (property-tested):

- Every selection is a suffix of the items, so order is kept and the window
  is contiguous.
- A tool call and its results are one unit: a cut never falls between an
  item that makes a call and the last item that answers it.
- Token-bounded strategies never exceed the budget: kept tokens + ``reserved``
  <= ``budget``. Unlike Hector, which keeps ``preserve_recent`` messages "even
  if they exceed the budget slightly", when even the preserved messages do not
  fit, the longest newest suffix that fits is kept (possibly nothing).
- Deterministic: the same input gives the same output.

Where memq differs from Hector on purpose: Hector's ``summary_buffer``
appends its summary event *after* the recent messages it meant to keep and
then starts the window at that summary event, so the recent window is lost
after every summary (``pkg/memory/summary_buffer.go``: ``summarize`` keeps
``recentEvents`` out of the summary, ``FilterEvents`` then slices
``events[summaryIdx:]``). memq's checkpoint records the seq it covers
(:attr:`Selection.summarize_up_to`), and everything after it stays.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from itertools import accumulate
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from memq.contracts.errors import InvalidRequest
from memq.contracts.vocabulary import STRATEGY_KINDS, STRATEGY_NAMES, StrategyKind, normalize_kind

if TYPE_CHECKING:  # the settings import this module: no query models for them
    from memq.contracts.queries import StrategySpec

# The strategy kinds are the contract's (memq.contracts.queries); other names
# accepted wherever a strategy is named (Hector's "none" for what memq calls
# "all") are in NAMES.
Kind = StrategyKind
KINDS: tuple[str, ...] = STRATEGY_KINDS
NAMES: tuple[str, ...] = STRATEGY_NAMES
DEFAULT_KIND: Kind = "summary_buffer"  # budgeted out of the box (docs/design.md, Working memory and recall)
# summary_buffer: the budget's share that recalled memories may take ahead of
# the summary and the older messages (never ahead of min_recent). Chosen on
# LoCoMo dev by leave-one-conversation-out: the least recall within 2 points
# of the best evidence (tests/bench/context_split.py).
RECALL_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Item:
    """One event as the strategies see it.

    Attributes:
        seq: the event's stream sequence (its position in the session).
        role: ``user``, ``assistant``, ``system`` or ``tool``.
        tokens: :func:`~memq.workers.memory.tokens.count_event` of the event.
        call_ids: ids of the tool calls made in this event.
        result_ids: ids of the tool calls answered in this event.
    """

    seq: int
    role: str
    tokens: int
    call_ids: frozenset[str] = frozenset()
    result_ids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Strategy:
    """A working-memory strategy and its settings.

    Parameters (defaults as in Hector's current docs and ``ContextConfig``):
        kind: ``"summary_buffer"`` (default: a context fits its budget unless
            asked otherwise), ``"all"`` (alias ``"none"``, normalised to
            ``"all"``), ``"buffer_window"`` or ``"token_window"``.
        window: buffer_window: the last N messages (default 20).
        turns: buffer_window: if set, the last K user turns with everything
            after each, instead of ``window`` (default None).
        budget: token_window / summary_buffer: token budget (default 8000).
        preserve_recent: token_window: recent messages kept whenever they fit
            (default 5).
        threshold: summary_buffer: ask for a summary when history + reserved
            passes ``threshold * budget`` (default 0.85).
        target: summary_buffer: after summarizing, aim at ``target * budget``
            (default 0.7); must not exceed ``threshold``.
        min_recent: summary_buffer: recent messages never folded into a
            summary and kept whenever they fit (default 3).
        recall_share: summary_buffer: when recall has memories, they may take
            up to this share of the budget (less the instruction) before the
            summary and the older messages; they also get whatever those
            leave (default :data:`RECALL_SHARE`; 0 gives recall only the rest).
    """

    kind: Kind = DEFAULT_KIND
    window: int = 20
    turns: int | None = None
    budget: int = 8000
    preserve_recent: int = 5
    threshold: float = 0.85
    target: float = 0.7
    min_recent: int = 3
    recall_share: float = RECALL_SHARE

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", normalize_kind(self.kind))  # frozen: set once, here
        if self.kind not in KINDS:
            raise ValueError(f"unknown strategy {self.kind!r} (one of {', '.join(NAMES)})")
        if self.window < 1:
            raise ValueError("window must be at least 1")
        if self.turns is not None and self.turns < 1:
            raise ValueError("turns must be at least 1")
        if self.budget < 0:
            raise ValueError("budget must not be negative")
        if self.preserve_recent < 0 or self.min_recent < 0:
            raise ValueError("preserve_recent and min_recent must not be negative")
        if not (0 < self.threshold <= 1) or not (0 < self.target <= 1):
            raise ValueError("threshold and target must be in (0, 1]")
        if not (0 <= self.recall_share < 1):
            raise ValueError("recall_share must be in [0, 1)")
        if self.target > self.threshold:
            # else a fresh summary could leave history above the threshold
            # and the summarizer would run again at once
            raise ValueError("target must not exceed threshold")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Strategy:
        """Build from settings (e.g. per-app config merged with a request);
        unknown keys raise ``ValueError`` rather than being ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown strategy settings: {', '.join(unknown)}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def rules(self) -> Rules:
        """What this strategy's kind does (:data:`RULES`)."""
        return RULES[self.kind]

    @property
    def token_bounded(self) -> bool:
        return self.rules.token_bounded

    @property
    def from_checkpoint(self) -> bool:
        """Does it start after the latest summary checkpoint (and so ask the
        summarizer for new ones)?"""
        return self.rules.from_checkpoint

    @property
    def keep_recent(self) -> int:
        """How many recent messages this strategy keeps whenever they fit."""
        return self.rules.keep_recent(self)

    def needs_from(self, items: Sequence[Item], reserved: int = 0) -> int | None:
        """How far back this strategy needs: where the shortest suffix of
        ``items`` (oldest first) that holds everything it can keep starts;
        None when not even all of ``items`` are enough (read further back)."""
        return self.rules.needs_from(self, items, reserved)


# --- what each kind does -----------------------------------------------------------

# How far past what a strategy keeps a reader must look back: a tool call
# whose result opens the window may sit up to this many events, or tokens,
# earlier (the SQL walk reads 256 events a page: half a page of margin).
MARGIN_EVENTS = 129
MARGIN_TOKENS = 2048

RecallRoom = Literal["rest", "before_older", "share"]


class Rules(ABC):
    """One strategy kind's behaviour: the only place that knows what a kind
    does, so nothing else switches on its name (readers ask the attributes).

    Attributes:
        name: the kind, as the contract spells it.
        token_bounded: keeps its window within the budget.
        from_checkpoint: starts after the latest summary checkpoint, so the
            summarizer folds its sessions and its reads start there.
        recall_room: where recalled memories find their tokens in a context:
            ``"rest"`` what the window leaves, ``"before_older"`` ahead of all
            but the preserved recent messages, ``"share"`` up to the
            strategy's ``recall_share`` first, then the rest.
        unbounded_why: for a kind that is not token-bounded, why its context
            can pass the budget (said to the caller).
        params: the settings its result depends on (for captions).
        keeps_all: keeps every event it is given (its selection is its
            whole window).
    """

    name: ClassVar[Kind]
    params: ClassVar[tuple[str, ...]] = ()
    token_bounded: ClassVar[bool] = False
    from_checkpoint: ClassVar[bool] = False
    recall_room: ClassVar[RecallRoom] = "rest"
    unbounded_why: ClassVar[str] = ""
    keeps_all: ClassVar[bool] = False

    def keep_recent(self, strategy: Strategy) -> int:
        """Recent messages kept whenever they fit."""
        return 0

    @abstractmethod
    def cut(self, strategy: Strategy, items: Sequence[Item], valid: Sequence[bool], reserved: int) -> int:
        """Where the kept window starts (a valid cut of ``items``)."""

    @abstractmethod
    def needs_from(self, strategy: Strategy, items: Sequence[Item], reserved: int) -> int | None:
        """See :meth:`Strategy.needs_from`."""


class KeepAll(Rules):
    name = "all"
    keeps_all = True
    unbounded_why = "keeps every event"

    def cut(self, strategy: Strategy, items: Sequence[Item], valid: Sequence[bool], reserved: int) -> int:
        return 0

    def needs_from(self, strategy: Strategy, items: Sequence[Item], reserved: int) -> int | None:
        return None  # everything, always


class BufferWindow(Rules):
    name = "buffer_window"
    params = ("window", "turns")
    unbounded_why = "counts messages, not tokens"

    def cut(self, strategy: Strategy, items: Sequence[Item], valid: Sequence[bool], reserved: int) -> int:
        if strategy.turns is not None:
            starts = _turn_starts(items)
            target = starts[-strategy.turns] if len(starts) >= strategy.turns else 0
        else:
            target = max(0, len(items) - strategy.window)
        return _floor_valid(valid, target)

    def needs_from(self, strategy: Strategy, items: Sequence[Item], reserved: int) -> int | None:
        if strategy.turns is None:
            keep = strategy.window + MARGIN_EVENTS
            return len(items) - keep if len(items) >= keep else None
        users = 0
        for i in range(len(items) - 1, -1, -1):
            users += items[i].role == "user"
            if users > strategy.turns + 1:
                return i
        return None


class TokenWindow(Rules):
    name: ClassVar[Kind] = "token_window"
    params: ClassVar[tuple[str, ...]] = ("budget", "preserve_recent")
    token_bounded = True
    recall_room: ClassVar[RecallRoom] = "before_older"

    def keep_recent(self, strategy: Strategy) -> int:
        return strategy.preserve_recent

    def cut(self, strategy: Strategy, items: Sequence[Item], valid: Sequence[bool], reserved: int) -> int:
        found = _longest_fitting(valid, _suffix_tokens(items), strategy.budget - reserved)
        return len(items) if found is None else found

    def needs_from(self, strategy: Strategy, items: Sequence[Item], reserved: int) -> int | None:
        tokens = reserved
        for i in range(len(items) - 1, -1, -1):
            tokens += items[i].tokens
            if tokens > strategy.budget + MARGIN_TOKENS:
                return i
        return None


class SummaryBuffer(TokenWindow):
    """A token window over the events after the latest checkpoint."""

    name = "summary_buffer"
    params = ("budget", "threshold", "target", "min_recent")
    from_checkpoint = True
    recall_room = "share"

    def keep_recent(self, strategy: Strategy) -> int:
        return strategy.min_recent


RULES: Mapping[str, Rules] = {r.name: r for r in (KeepAll(), BufferWindow(), TokenWindow(), SummaryBuffer())}


class SupportsModelDump(Protocol):
    """A pydantic model, as far as :func:`strategy_for` needs one (memory/
    stays free of the settings module, which imports this one)."""

    def model_dump(self, *, exclude: Any = None, exclude_none: bool = False) -> dict[str, Any]: ...


def strategy_for(defaults: SupportsModelDump, app_overrides: Mapping[str, Any], spec: StrategySpec | None) -> Strategy:
    """The strategy in force: the deployment's defaults (``MemorySettings``),
    then per-app settings, then the request's override. Settings name the
    kind ``strategy``; a bad combination is the caller's :class:`InvalidRequest`."""
    merged = defaults.model_dump(exclude={"model"})
    merged["kind"] = merged.pop("strategy")
    overrides = dict(app_overrides)
    if "strategy" in overrides:
        overrides["kind"] = overrides.pop("strategy")
    overrides.pop("model", None)
    merged.update(overrides)
    if spec is not None:
        merged.update(spec.model_dump(exclude_none=True))
    try:
        return Strategy.from_dict(merged)
    except ValueError as exc:
        raise InvalidRequest(f"strategy: {exc}") from None


@dataclass(frozen=True)
class Selection:
    """The result of :func:`select`.

    Attributes:
        items: the kept items, in order (a suffix of the input).
        tokens: the sum of their tokens.
        needs_summary: summary_buffer only: history after the checkpoint plus
            ``reserved`` passes ``threshold * budget`` and there is something
            to fold.
        summarize_up_to: with ``needs_summary``, the seq of the last item a
            summarizer should fold in (the new checkpoint's ``up_to_seq``) so
            that ``target * budget`` remains, keeping ``min_recent`` messages
            and tool call/result units whole; else None.
    """

    items: tuple[Item, ...]
    tokens: int
    needs_summary: bool = False
    summarize_up_to: int | None = None


def _fraction(budget: int, f: float) -> int:
    # Integer limits, like Hector's int(budget * threshold); the epsilon keeps
    # 0.85 * 8000 at 6800 despite binary floating point.
    return math.floor(budget * f + 1e-9)


_CALL_IDS, _TOKENS = attrgetter("call_ids"), attrgetter("tokens")  # in C: a window is read often


def valid_cuts(items: Sequence[Item]) -> list[bool]:
    """``valid[c]`` for ``c`` in ``0..len(items)``: may a window start at
    ``items[c]`` (keeping ``items[c:]``) without separating a tool call from
    a result? Cut 0 (keep all) and ``len(items)`` (keep none) are always
    valid. A result whose call is not in ``items`` constrains nothing."""
    n = len(items)
    if not any(map(_CALL_IDS, items)):  # a conversation without tools (most turns): every cut
        return [True] * (n + 1)
    first_call: dict[str, int] = {}
    for i, item in enumerate(items):
        for cid in item.call_ids:
            first_call.setdefault(cid, i)
    last_result: dict[str, int] = {}
    for i, item in enumerate(items):
        for rid in item.result_ids:
            start = first_call.get(rid)
            if start is not None and start < i:
                last_result[rid] = i
    # cuts start+1 .. end would leave the call out and a result in
    diff = [0] * (n + 2)
    for rid, end in last_result.items():
        diff[first_call[rid] + 1] += 1
        diff[end + 1] -= 1
    valid: list[bool] = []
    open_spans = 0
    for c in range(n + 1):
        open_spans += diff[c]
        valid.append(open_spans == 0)
    return valid


def _suffix_tokens(items: Sequence[Item]) -> list[int]:
    """``sums[c]``: the tokens of ``items[c:]``, for ``c`` in ``0..len(items)``."""
    sums = list(accumulate(reversed(list(map(_TOKENS, items))), initial=0))
    sums.reverse()
    return sums


def _floor_valid(valid: Sequence[bool], c: int) -> int:
    """The largest valid cut <= c (extends a window to keep a unit whole)."""
    while not valid[c]:
        c -= 1
    return c


def _longest_fitting(valid: Sequence[bool], sums: Sequence[int], limit: int, lo: int = 0) -> int | None:
    """The smallest valid cut >= lo whose suffix fits ``limit``, or None."""
    # suffix sums never grow with c (tokens are >= 0): every cut from the first fitting one fits
    c = bisect_left(sums, -limit, lo=lo, key=lambda s: -s)
    while c < len(sums) and not valid[c]:
        c += 1
    return c if c < len(sums) else None


def recent_cut(items: Sequence[Item], count: int, valid: Sequence[bool] | None = None) -> int:
    """Where the shortest whole-unit suffix holding the last ``count`` items starts."""
    valid = valid_cuts(items) if valid is None else valid
    return _floor_valid(valid, max(0, len(items) - count))


def _turn_starts(items: Sequence[Item]) -> list[int]:
    # A turn starts at a user message; a user-role event that carries tool
    # results (ADK sends function responses as role "user") is not a turn.
    return [i for i, it in enumerate(items) if it.role == "user" and not it.result_ids and not it.call_ids]


def select(items: Sequence[Item], strategy: Strategy, *, reserved: int = 0) -> Selection:
    """Apply ``strategy`` to ``items`` (in stream order).

    Parameters:
        items: the session's events as :class:`Item` s; for
            ``summary_buffer``, only those after the latest checkpoint.
        strategy: the :class:`Strategy`.
        reserved: tokens already spent elsewhere in the same budget (default
            0), e.g. instruction, summary, recalled memories and reply priming.

    Semantics: ``all`` keeps everything. ``buffer_window`` keeps the last
    ``window`` items, or everything from the ``turns``-th last user turn on;
    when that cut would separate a tool call from its result it moves earlier
    to keep the unit (so a window may exceed ``window`` by the rest of a
    unit). ``token_window`` and ``summary_buffer`` keep the longest whole-unit
    suffix with ``tokens + reserved <= budget``; any shorter suffix that fits,
    ``preserve_recent``/``min_recent`` included, is therefore kept too; when
    not even those fit, fewer are kept (never over budget).
    """
    valid = valid_cuts(items)
    kept = tuple(items[strategy.rules.cut(strategy, items, valid, reserved) :])
    tokens = sum(it.tokens for it in kept)
    if not strategy.from_checkpoint:
        return Selection(items=kept, tokens=tokens)
    up_to = _summarize_up_to(items, strategy, reserved, valid)
    return Selection(items=kept, tokens=tokens, needs_summary=up_to is not None, summarize_up_to=up_to)


def _summarize_up_to(items: Sequence[Item], strategy: Strategy, reserved: int, valid: Sequence[bool]) -> int | None:
    sums = _suffix_tokens(items)
    if sums[0] + reserved <= _fraction(strategy.budget, strategy.threshold):
        return None
    # Never fold the last min_recent messages (nor split a unit to do so).
    last_cut = recent_cut(items, strategy.min_recent, valid)
    goal = _fraction(strategy.budget, strategy.target) - reserved
    cut = _longest_fitting(valid, sums, goal)
    if cut is None or cut > last_cut:
        cut = last_cut  # min_recent outweighs the target
    if cut == 0:
        return None  # nothing can be folded
    return items[cut - 1].seq


def preserved(items: Sequence[Item], strategy: Strategy) -> tuple[Item, ...]:
    """The recent items ``strategy`` keeps whenever they fit (``preserve_recent``
    or ``min_recent``, widened to whole tool units); empty for other kinds.
    Context assembly uses this to keep recalled memories from crowding them out."""
    if not strategy.keep_recent:
        return ()
    return tuple(items[recent_cut(items, strategy.keep_recent) :])


# --- the summarizer's fold -----------------------------------------------------------

SUMMARY_SHARE = 0.5  # a new summary takes at most this share of target x budget: recent turns keep room
MIN_SUMMARY_TOKENS = 32


@dataclass(frozen=True)
class Fold:
    """What the summarizer folds: the items up to ``up_to`` (with the previous
    summary) into a summary of about ``summary_tokens``."""

    up_to: int
    summary_tokens: int


def fold(items: Sequence[Item], strategy: Strategy, *, reserved: int = 0) -> Fold | None:
    """The next fold of a ``summary_buffer`` session, or None if none is due.

    ``reserved`` is the current summary's tokens. A fold is due when
    :func:`select` says so; it then goes far enough to leave the *new* summary
    its share of ``target * budget`` (folding only down to the old summary's
    size would starve the new one), never into ``min_recent`` nor through a
    tool unit.
    """
    if not select(items, strategy, reserved=reserved).needs_summary:
        return None
    goal = _fraction(strategy.budget, strategy.target)
    room = max(reserved, int(goal * SUMMARY_SHARE))
    up_to = _summarize_up_to(items, strategy, room, valid_cuts(items)) or _summarize_up_to(
        items, strategy, reserved, valid_cuts(items)
    )
    if up_to is None:
        return None
    kept = sum(it.tokens for it in items if it.seq > up_to)
    return Fold(up_to, max(MIN_SUMMARY_TOKENS, min(goal - kept, int(goal * SUMMARY_SHARE))))
