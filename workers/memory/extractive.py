"""Offline extractive summarizer: the embedded default (docs/design.md, Working memory and recall).

The summarizer worker folds the oldest events of a session into a checkpoint
summary, and the previous checkpoint into the new one. :func:`summarize` keeps
the sentences that carry names, dates, numbers and decisions, one per line::

    [2023-05-08] Caroline: I went to a LGBTQ support group yesterday.

The previous summary's lines are candidates too, scored like new sentences, so
however often a session is folded the summary stays within its target and the
most informative facts survive. Pure and deterministic: no I/O, no randomness.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from memq.workers.memory.tokens import count_text

ELLIPSIS = "…"
MIN_SCORE = 0.0  # at or below: chit-chat ("Hey Mel!", "lol"), not kept even when room is left


@dataclass(frozen=True)
class Turn:
    """One message to summarize; ``timestamp`` in unix seconds (UTC)."""

    author: str
    text: str
    timestamp: float | None = None


def format_turn(turn: Turn) -> str:
    """``[YYYY-MM-DD] Author: text`` (no date without a timestamp, no author prefix without an author)."""
    date = ""
    if turn.timestamp is not None:
        try:
            date = f"[{datetime.fromtimestamp(turn.timestamp, tz=UTC):%Y-%m-%d}] "
        except (OverflowError, OSError, ValueError):
            pass  # a nonsense timestamp loses its date, not the turn
    author = " ".join((turn.author or "").split())
    return f"{date}{author + ': ' if author else ''}{' '.join(turn.text.split())}"


# --- sentences -----------------------------------------------------------------

# A sentence ends at . ! ? (maybe followed by a closing quote or bracket) and
# whitespace; a line break always ends one (bullets, wrapped LLM output).
_BOUNDARY = re.compile(r"(?<=[.!?][\"'”’)\]])\s+|(?<=[.!?])\s+")
# Words whose trailing dot does not end a sentence; single letters (initials) neither.
_ABBREVIATIONS = frozenset("dr mr mrs ms prof st jr sr vs e.g i.e approx no fig inc ltd co mt".split())
_BULLET = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)])\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, whitespace collapsed, empty ones skipped."""
    out: list[str] = []
    for line in text.splitlines():
        pending = ""
        for piece in _BOUNDARY.split(line):
            pending = f"{pending} {piece}" if pending else piece
            last = pending.rsplit(None, 1)[-1].lower().rstrip(".") if pending.strip() else ""
            if pending.endswith(".") and (last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha())):
                continue  # "Dr. Smith", "e.g. this", "J. Doe": keep going
            if sentence := " ".join(pending.split()):
                out.append(sentence)
            pending = ""
        if sentence := " ".join(pending.split()):
            out.append(sentence)
    return out


# --- scoring -------------------------------------------------------------------

_MONTHS = "January February March April May June July August September October November December"
_DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday"
_CALENDAR = frozenset(_MONTHS.split() + _DAYS.split())
_DATE = re.compile(
    rf"\b(?:{'|'.join(_CALENDAR)})\b"  # capitalized: "may" the verb is no date
    r"|\b(?i:yesterday|today|tonight|tomorrow|ago|weekend"
    r"|(?:last|next|this|coming|past) (?:week|month|year|summer|winter|spring|fall|autumn|night))\b"
    r"|\b(?:1[89]|20)\d\d\b|\b\d{1,4}[/-]\d{1,2}[/-]\d{1,4}\b|\b\d{1,2}(?:st|nd|rd|th)\b"
)
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_NUMBER_WORD = re.compile(
    r"\b(?i:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|fifty"
    r"|hundred|thousand|million|billion|dozen|first|second|third|half)\b"
)
_DECISION = re.compile(
    r"(?i:\b(?:decid(?:e|ed|ing)|will|going to|gonna|plan(?:s|ned|ning)?|agreed|agree to|bought|adopt(?:ed|ing)?"
    r"|moved|moving|start(?:ed|ing)|finish(?:ed)?|sign(?:ed)? up|booked|promis(?:e|ed)|got (?:a|the|my) job"
    r"|new job|hired|married|engaged|born|graduat(?:ed|ing)|joined|quit|won|visit(?:ed|ing)|went|attended"
    r"|travell?ed|applied|accepted|scheduled|deadline|chose|ordered|launched|released|deployed|fixed"
    r"|retired|broke up|divorced|passed away|died)\b|['’]ll\b)"
)
_FIRST_PERSON = re.compile(r"\b(?:I am|I['’]m|I was|I have|I['’]ve|I had|[Mm]y|[Ww]e are|[Ww]e have|[Oo]ur)\b")
_GREETING = re.compile(
    r"^(?i:hi|hey|hello|thanks|thank you|thx|lol|haha\w*|wow|ok|okay|cool|nice|great|awesome|bye"
    r"|good (?:morning|night|evening)|yeah|yes|yep|nope|sure|omg|aww\w*)\b"
)
_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_VOCATIVE = re.compile(r",\s*[^\W\d_][\w'’-]*[\s.!?]*$")  # "Thanks, Mel!": addressing, not a fact
_NOT_NAMES = frozenset("I I'm I've I'll I'd OK Ok Okay Oh Hi Hey Hello Yes No Thanks LOL Lol Wow OMG Omg".split())


def score(sentence: str) -> float:
    """How many facts ``sentence`` seems to carry (higher keeps it)."""
    words = _WORD.findall(sentence)
    # Names: capitalized words after the first (which is capitalized anyway).
    named = _WORD.findall(_VOCATIVE.sub("", sentence))[1:]
    names = {w for w in named if w[0].isupper() and w not in _NOT_NAMES and w not in _CALENDAR}
    dates = len(_DATE.findall(sentence))
    s = 2.0 * min(len(names), 3)  # who/what: the most asked-about facts
    s += (3.0 + min(dates - 1, 2)) if dates else 0.0  # "when" questions need one date; more help a bit
    s += 1.5 * min(len(_NUMBER.findall(sentence)), 2) + 1.0 * min(len(_NUMBER_WORD.findall(sentence)), 2)
    s += 2.5 * min(len(_DECISION.findall(sentence)), 2)  # decisions and events change the state of things
    s += 1.0 if _FIRST_PERSON.search(sentence) else 0.0  # "I am a nurse", "my dog": facts about a speaker
    s += 0.1 * min(len(words), 30)  # longer sentences say more, up to a point
    if len(words) < 4:
        s -= 2.0  # "Hi!", "Thanks!", "lol"
    if _GREETING.match(sentence):
        s -= 1.5  # chit-chat, even with a vocative name ("Hey Mel!")
    if sentence.rstrip("\"'”’) ").endswith("?"):
        s -= 1.5  # the answer carries the fact, not the question
    return s


# --- lines ---------------------------------------------------------------------

# "[YYYY-MM-DD] Author: text", date and author both optional.
_LINE = re.compile(r"^(?:\[(\d{4}-\d{2}-\d{2})\]\s*)?(?:([^\s:\[][^:.!?\n]{0,39}?):\s+)?(.*)$")


def _date(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    try:  # inf, nan and out-of-range stamps get no date rather than an error
        return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d")
    except (OverflowError, OSError, ValueError):
        return None


def _prefix(date: str | None, author: str | None) -> str:
    author = " ".join((author or "").split())
    return (f"[{date}] " if date else "") + (f"{author}: " if author else "")


def _truncate(line: str, limit: int, model: str | None) -> str:
    """``line`` cut at a word boundary with "…" to fit ``limit`` tokens ("" if no word fits)."""
    if count_text(line, model) <= limit:
        return line
    words = line.split(" ")

    def fits(k: int) -> bool:
        return count_text(" ".join(words[:k]) + ELLIPSIS, model) <= limit

    lo, hi = 0, len(words) - 1  # binary search for the most words that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    while lo > 0 and not fits(lo):  # token counts are not quite monotonic
        lo -= 1
    return " ".join(words[:lo]) + ELLIPSIS if lo else ""


def _normal(sentence: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", sentence.lower()).split())


def summarize(
    turns: Sequence[Turn], *, previous: str | None = None, target_tokens: int, model: str | None = None
) -> str:
    """Fold ``turns`` (oldest first) and the ``previous`` summary into one summary.

    Parameters:
        turns: the messages to fold, in chronological order.
        previous: the previous checkpoint summary (default None): this module's
            lines, or free text from an LLM summarizer; its lines come first.
        target_tokens: the most tokens the summary may have (``count_text``).
        model: whose tokenizer counts (default None: ``cl100k_base``).

    Returns one sentence per line, ``[YYYY-MM-DD] Author: sentence`` (no date
    without a timestamp), chronological; "" when nothing fits. Sentences are
    chosen greedily by :func:`score`, ties to the newer then the earlier one;
    a duplicate sentence is kept once (the first); a sentence longer than the
    target is cut at a word boundary with "…".
    """
    units: list[tuple[str, list[str]]] = []  # (prefix, sentences) in chronological order
    for raw in (previous or "").splitlines():
        match = _LINE.match(_BULLET.sub("", raw.strip()))
        date, author, body = match.groups() if match else (None, None, raw)
        units.append((_prefix(date, author), split_sentences(body)))
    units += [(_prefix(_date(t.timestamp), t.author), split_sentences(t.text)) for t in turns]

    seen: set[str] = set()
    candidates: list[tuple[float, int, int, str]] = []  # (score, unit, position, line)
    for u, (prefix, sentences) in enumerate(units):
        for p, sentence in enumerate(sentences):
            key = _normal(sentence) or sentence
            if key in seen:
                continue
            seen.add(key)
            value = score(sentence)
            if value > MIN_SCORE and (line := _truncate(prefix + sentence, target_tokens, model)):
                candidates.append((value, u, p, line))

    # Each line costs its tokens plus one for the newline after it; the last
    # line has none, hence target + 1. The exact count is checked below.
    budget = target_tokens + 1
    ranked = sorted(candidates, key=lambda c: (-c[0], -c[1], c[2]))
    chosen: list[tuple[float, int, int, str]] = []
    for candidate in ranked:
        cost = count_text(candidate[3], model) + 1
        if cost <= budget:
            chosen.append(candidate)
            budget -= cost
    while chosen:  # BPE may merge across a newline: drop the weakest until exact
        text = "\n".join(c[3] for c in sorted(chosen, key=lambda c: (c[1], c[2])))
        if count_text(text, model) <= target_tokens:
            return text
        chosen.pop()
    return ""
