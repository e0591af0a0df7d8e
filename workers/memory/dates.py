"""Calendar dates a query names, as time ranges (pure).

"What did Nate make on 9 November, 2022?" asks about what was said that day.
The indexed text carries its date as ``[2022-11-09]``, which neither BM25
nor the embedding relates to "9 November, 2022"; the ranking instead boosts
the memories whose timestamp falls in the range the query names
(:func:`memq.workers.memory.recall.rank`). English month names only, like
the rest of the ranking's heuristics.
"""

from __future__ import annotations

import re
from calendar import monthrange
from datetime import UTC, datetime, timedelta

Period = tuple[float, float]  # [start, end) as UTC timestamps

MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
# A timestamp is UTC and a person's day is local: a day named in a query
# covers a day either side of the UTC day, as time zones span ±14 h.
DAY_SLACK = timedelta(days=1)

_MONTH = "(?P<month>" + "|".join(MONTHS) + ")"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
# Most specific first: a day, then a month, then a year alone.
_PATTERNS = (
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE),  # 9 November, 2022
    re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.IGNORECASE),  # November 9, 2022
    re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE),  # November 2022
    re.compile(rf"\b{_YEAR}\b"),  # 2022
)


def named_periods(text: str) -> tuple[Period, ...]:
    """The ranges of the dates ``text`` names, in the order found: a day
    (with :data:`DAY_SLACK` either side), a month or a year. A date inside a
    more specific one ("2022" in "9 November, 2022") is not counted twice;
    impossible dates ("31 February, 2022") are skipped."""
    taken: list[tuple[int, int]] = []
    found: list[Period] = []
    for pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if any(start < m.end() and m.start() < end for start, end in taken):
                continue
            taken.append(m.span())
            period = _period(m.groupdict())
            if period is not None:
                found.append(period)
    return tuple(found)


def _period(parts: dict[str, str | None]) -> Period | None:
    year = int(parts["year"] or 0)  # every pattern has one
    month_name, day_text = parts.get("month"), parts.get("day")
    if month_name is None:
        return _span(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC))
    month = MONTHS.index(month_name.lower()) + 1
    if day_text is None:
        first = datetime(year, month, 1, tzinfo=UTC)
        return _span(first, first + timedelta(days=monthrange(year, month)[1]))
    try:
        day = datetime(year, month, int(day_text), tzinfo=UTC)
    except ValueError:
        return None
    return _span(day - DAY_SLACK, day + timedelta(days=1) + DAY_SLACK)


def _span(start: datetime, end: datetime) -> Period:
    return start.timestamp(), end.timestamp()


def within(timestamp: float, periods: tuple[Period, ...]) -> bool:
    return any(start <= timestamp < end for start, end in periods)
