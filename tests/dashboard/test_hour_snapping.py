"""The job page snaps its GPU buckets to the rollups' grids: a budget that gives buckets between
one and two hours wide takes fewer points (down to half) so that they are two hours or more,
and ``queries.gpu_series`` reads ``gpu_hours`` instead of the minutes."""

from __future__ import annotations

import datetime as dt

import pytest

from jobsight.collector.query import series as queries
from jobsight.collector.query.grids import rollup_points
from jobsight.collector.query.time_range import TimeRange

START = dt.datetime(2026, 3, 2, 6, 41, 17, tzinfo=dt.UTC)
"""A job's first sample, off the hour: the query's buckets start at 06:00."""


def _hours_wide(window: TimeRange, points: int) -> float:
    """The width, in hours, of the buckets the hour rollup's statement would use."""
    return window.from_hour().bucket_seconds(points) / 3600


def test_a_multi_day_job_takes_two_hour_buckets() -> None:
    """9 days, 64 GPUs: the heatmap's 125 buckets a GPU are 1.7 hours wide; 108 are 2 hours."""
    window = TimeRange(START, START + dt.timedelta(days=9))
    assert 1 < _hours_wide(window, 125) < 2
    points = rollup_points(window, 125)
    assert points == 108 and _hours_wide(window, points) >= 2
    assert window.from_hour().bucket_seconds(points) >= queries.HOUR_ROLLUP_MIN_BUCKET_S
    assert _hours_wide(window, points + 1) < 2  # the most points that read the hours


def test_widths_are_worked_out_from_the_first_hour() -> None:
    """200 hours from 06:00 (the hour of the first sample, 06:41): 100 points are 2 hours wide
    from there, though the samples themselves span less."""
    window = TimeRange(START, START.replace(minute=0, second=0) + dt.timedelta(hours=200, microseconds=-1))
    assert window.bucket_seconds(100) < queries.HOUR_ROLLUP_MIN_BUCKET_S
    assert rollup_points(window, 100) == 100
    assert rollup_points(TimeRange(START, window.end + dt.timedelta(hours=1)), 101) == 100


@pytest.mark.parametrize(("span", "points"), [
    (dt.timedelta(days=30), 125),  # buckets of 5.8 hours: the hours already
    (dt.timedelta(days=1), 125),  # 11.5 minutes: the minutes already, and hours are not in reach
    (dt.timedelta(hours=90), 100),  # 0.9 hours: two-hour buckets would take fewer than half the points
])
def test_budgets_away_from_the_hour_threshold_are_kept(span: dt.timedelta, points: int) -> None:
    assert rollup_points(TimeRange(START, START + span), points) == points


def test_the_minute_snapping_is_unchanged() -> None:
    """15 buckets over 30 minutes, a second under two minutes each: 14 read the minutes."""
    start = dt.datetime(2024, 3, 4, 12, 0, 0, tzinfo=dt.UTC)
    window = TimeRange(start, start + dt.timedelta(seconds=1799))
    assert rollup_points(window, 15) == 14
    assert rollup_points(window, 125) == 125


def test_a_start_in_a_half_hour_zone_is_cut_at_the_utc_hour() -> None:
    """Times in a session zone half an hour off UTC: the hour is UTC's, as the rollup's rows."""
    kolkata = dt.timezone(dt.timedelta(hours=5, minutes=30))
    window = TimeRange(START.astimezone(kolkata), START.astimezone(kolkata) + dt.timedelta(days=9))
    assert window.from_hour().start == START.replace(minute=0, second=0)
    assert rollup_points(window, 125) == 108
