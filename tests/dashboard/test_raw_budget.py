"""A short job with many GPUs or ranks reads its per-minute rollup, not its raw rows: the grid
takes the rollup's coarser buckets once the raw rows it would read pass RAW_ROWS_MAX."""

from __future__ import annotations

import datetime as dt
from typing import Any

from jobsight.collector.query import series as queries
from jobsight.collector.query.grids import GPU_ROLLUP, MIN_ROLLUP_POINTS, RAW_ROWS_MAX, STEP_ROLLUP, raw_budget_points
from jobsight.collector.query.time_range import TimeRange

START = dt.datetime(2026, 3, 2, 6, 41, 0, tzinfo=dt.UTC)


def _probe(series: int, count: str, per_series: int) -> list[dict[str, Any]]:
    """What the page's probe returns: one bucket per series over the last two minutes."""
    return [{"rank": n, count: per_series} for n in range(series)]


def test_a_64_gpu_half_hour_reads_the_minutes() -> None:
    window = TimeRange(START, START + dt.timedelta(minutes=30))
    assert 64 * 1800 > RAW_ROWS_MAX
    points = raw_budget_points(window, 125, _probe(64, "samples", 120), GPU_ROLLUP)
    assert points == 15 and window.from_minute().bucket_seconds(points) >= queries.ROLLUP_MIN_BUCKET_S
    steps = raw_budget_points(window, 125, _probe(64, "steps", 120), STEP_ROLLUP)
    assert steps == 30 and window.from_minute().bucket_seconds(steps) >= queries.STEP_ROLLUP_MIN_BUCKET_S


def test_few_raw_rows_keep_the_budget() -> None:
    window = TimeRange(START, START + dt.timedelta(minutes=30))
    assert raw_budget_points(window, 600, _probe(2, "samples", 120), GPU_ROLLUP) == 600  # 3,600 samples
    # A rank stepping once a minute: 64 ranks x 30 steps.
    assert raw_budget_points(window, 125, _probe(64, "steps", 2), STEP_ROLLUP) == 125


def test_a_fresh_job_is_read_raw_rather_than_in_a_bucket_or_two() -> None:
    window = TimeRange(START, START + dt.timedelta(minutes=4))
    fitted = int(240 // queries.ROLLUP_MIN_BUCKET_S)
    assert fitted < MIN_ROLLUP_POINTS
    assert raw_budget_points(window, 15, _probe(512, "samples", 120), GPU_ROLLUP) == 15


def test_buckets_already_on_the_rollup_are_left_alone() -> None:
    window = TimeRange(START, START + dt.timedelta(days=1))
    assert raw_budget_points(window, 125, _probe(64, "samples", 120), GPU_ROLLUP) == 125
