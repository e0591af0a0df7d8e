"""The dates a query names, as the time ranges the ranking boosts."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from memq.workers.memory.dates import MONTHS, named_periods, within


def ts(*date: int) -> float:
    return datetime(*date, tzinfo=UTC).timestamp()


def test_a_day_in_either_order_with_a_day_of_slack_either_side():
    day = ((ts(2022, 11, 8), ts(2022, 11, 11)),)
    assert named_periods("What dish did Nate make on 9 November, 2022?") == day
    assert named_periods("What movie did Nate watch on November 9, 2022?") == day
    assert named_periods("on November 9th 2022") == day
    assert named_periods("on the 9th of November, 2022") == day


def test_a_month_and_a_year_cover_the_whole_of_it():
    assert named_periods("What did Joanna share in August 2022?") == ((ts(2022, 8, 1), ts(2022, 9, 1)),)
    assert named_periods("in February, 2024") == ((ts(2024, 2, 1), ts(2024, 3, 1)),)  # a leap year
    assert named_periods("What did Jon do in 2023?") == ((ts(2023, 1, 1), ts(2024, 1, 1)),)


def test_a_date_is_counted_once_and_several_are_all_found():
    found = named_periods("between 9 May, 2023 and June 2023")
    assert found == ((ts(2023, 5, 8), ts(2023, 5, 11)), (ts(2023, 6, 1), ts(2023, 7, 1)))


def test_no_date_no_period():
    assert named_periods("When did Caroline go to the support group?") == ()
    assert named_periods("What did she say in May?") == ()  # a month without a year: which May?
    assert named_periods("31 February, 2022") == ()  # no such day


@given(st.integers(1990, 2060), st.integers(1, 12), st.integers(1, 28), st.integers(0, 86399))
def test_a_moment_of_a_named_day_is_within_its_period(year, month, day, second):
    moment = ts(year, month, day) + second
    for text in (f"on {day} {MONTHS[month - 1].title()}, {year}", f"in {MONTHS[month - 1]} {year}", f"in {year}"):
        assert within(moment, named_periods(text)), text
    assert not within(moment, named_periods(f"in {year + 1}"))
