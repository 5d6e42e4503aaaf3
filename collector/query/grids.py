"""A chart's grid in one call: every series of a job at the resolution that fits the page's budget.

The dashboard asks for a chart (:func:`read_gpu_grid`, :func:`read_step_grid`,
:func:`read_metric_grid`) with its budget (``cells`` shared by all series, ``most`` buckets a
series at most) and draws what comes back. How wide the buckets are, and which grain is read for
them (the samples, the per-minute or per-hour rollup), is decided here and in the series queries
(:func:`jobsight.collector.query.series.rollup_grains`), nowhere else.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jobsight.collector.query import sampling, series
from jobsight.collector.query.time_range import TimeRange
from jobsight.collector.store.db import Connection

MIN_SERIES_POINTS: Final = 8
"""Fewest buckets a series is given however many share a budget: below this a GPU's row or a
rank's line no longer shows a trend, so a very large job goes over its budget instead."""


def points_per_series(budget: int, series_count: int, most: int) -> int:
    """Time buckets per series when ``series_count`` series share ``budget`` points: ``budget //
    series_count``, at most ``most`` (a single series' worth) and at least :data:`MIN_SERIES_POINTS`."""
    return max(MIN_SERIES_POINTS, min(most, budget // max(series_count, 1)))


# A job's GPUs and ranks are counted on its last minutes of data before its series are read, so
# that the series can be read at a resolution that fits them all in the page's budget.
PROBE: Final = dt.timedelta(minutes=2)

SeriesCount = Callable[[Sequence[dict[str, Any]]], int]
"""How many series share a budget, from rows of a series query."""


def _distinct(*key: str) -> SeriesCount:
    """Series named by ``key``: all of them share the budget (the heatmap's GPUs, the band's ranks)."""
    name = operator.itemgetter(*key)
    return lambda rows: len(set(map(name, rows)))


def _most_ranks_per_metric(rows: Sequence[dict[str, Any]]) -> int:
    """Each metric has its own chart, so the budget is shared by the ranks of the metric with most."""
    ranks: dict[str, set[Any]] = {}
    for r in rows:
        ranks.setdefault(r["name"], set()).add(r["rank"])
    return max(map(len, ranks.values()), default=0)


def rollup_points(window: TimeRange, points: int) -> int:
    """``points``, or fewer (down to half) when that makes :func:`series.gpu_series` read a rollup
    (hours, else minutes) instead of a finer one or the raw samples.

    Each rollup is some sixty times fewer rows than the grain below. A budget that lands just under
    a rollup's threshold would otherwise read the finer grain: a 512-GPU job's 15 buckets over 30
    minutes are two minutes wide, give or take a second (0.7 s on its samples instead of 0.06 s on
    its minutes); a 64-GPU job's 125 buckets over 9 days are 1.7 hours wide (830 k minute rows
    instead of 14 k hour rows). The grains and their thresholds are the series query's own
    (:func:`series.rollup_grains`)."""
    for aligned, least in series.rollup_grains(window):
        fitted = _points_for(aligned, points, least)
        if fitted is not None:
            return fitted
    return points


def _points_for(aligned: TimeRange, points: int, least: float) -> int | None:
    """``points`` if its buckets over ``aligned`` are ``least`` seconds or wider; else the most
    points that are, if that is at least half of ``points``; else ``None``."""
    if aligned.bucket_seconds(points) >= least:
        return points
    fitted = int((aligned.end - aligned.start).total_seconds() // least)
    return fitted if fitted >= max(points / 2, 1) else None


RAW_ROWS_MAX: Final = 20_000
"""Raw rows a grid may read; a job whose series would read more (a 64-GPU job's first half hour
at 1 Hz is 115 k samples) reads its per-minute rollup even when that gives fewer buckets than
the budget allows, as long as it gives at least :data:`MIN_ROLLUP_POINTS`."""
MIN_ROLLUP_POINTS: Final = 10


@dataclass(frozen=True)
class Rollup:
    """The finest rollup a grid's query reads: from buckets of ``least_s`` seconds, and the
    column of its rows that counts the raw rows each bucket holds."""

    least_s: float
    count: str


GPU_ROLLUP: Final = Rollup(series.ROLLUP_MIN_BUCKET_S, "samples")
STEP_ROLLUP: Final = Rollup(series.STEP_ROLLUP_MIN_BUCKET_S, "steps")


def raw_rows(window: TimeRange, recent: Sequence[dict[str, Any]], rollup: Rollup) -> float:
    """The raw rows a read of ``window`` would scan, estimated from ``recent`` (one bucket per series
    over the last :data:`PROBE`): a short job's rows come at the rate of its last minutes. A probe read
    from a rollup counts whole minutes, from its bucket's start (the minute the probe began in): its
    rows are over that longer span, else a probe that began late in a minute counted half as many
    again, and a window that fits was read from the rollup."""
    span_s = (window.end - window.start).total_seconds()
    probe_s = min(PROBE.total_seconds(), span_s)
    starts = [r["bucket"] for r in recent if r.get("bucket") is not None]
    if starts:
        probe_s = max(probe_s, (window.end - min(starts)).total_seconds())
    return sum(int(r.get(rollup.count) or 0) for r in recent) * span_s / (probe_s or 1.0)


def raw_budget_points(window: TimeRange, points: int, recent: Sequence[dict[str, Any]], rollup: Rollup) -> int:
    """``points``, or the rollup's grid when reading ``points`` buckets would read more than
    :data:`RAW_ROWS_MAX` raw rows (:func:`raw_rows`)."""
    aligned = window.from_minute()
    if aligned.bucket_seconds(points) >= rollup.least_s:
        return points  # the rollup is read already
    fitted = int((aligned.end - aligned.start).total_seconds() // rollup.least_s)
    return fitted if raw_rows(window, recent, rollup) > RAW_ROWS_MAX and fitted >= MIN_ROLLUP_POINTS else points


SAMPLING_POINTS_MAX: Final = 1200
"""Most buckets a series is read at its sampling interval: about a wide chart's pixels (15 minutes
at 1 Hz are 901). A longer run of samples gets the page's budget of buckets instead."""


def sampling_points(window: TimeRange, points: int, interval: float | None, raw: float) -> int:
    """``points``, or more: one bucket a sampling ``interval`` (seconds) over ``window`` when its ``raw``
    rows are within :data:`RAW_ROWS_MAX` and the buckets within :data:`SAMPLING_POINTS_MAX` a series.
    The rows read are then the cells drawn, a sample a cell, nothing averaged away; a window of more
    samples reads the budget's buckets (a rollup's when those are wide enough). ``None`` ``interval``
    (not known): ``points``."""
    if interval is None or interval <= 0 or raw > RAW_ROWS_MAX:
        return points
    # One more than the intervals the span holds: buckets a hair under one interval, which the series
    # query widens to one whole interval centred on the samples (series._sample_buckets).
    sharp = math.ceil((window.end - window.start).total_seconds() / interval) + 1
    return sharp if points < sharp <= SAMPLING_POINTS_MAX else points


def last(window: TimeRange, span: dt.timedelta | None) -> TimeRange:
    """The last ``span`` of ``window`` (all of it when shorter, or ``span`` is ``None``)."""
    if span is None or window.end - window.start <= span:
        return window
    return TimeRange(window.end - span, window.end)


def _read_grid(conn: Connection, read: Callable[..., list[dict[str, Any]]], table: str, count: SeriesCount,
               cluster: str, job_id: str, cells: int, most: int, *, rollup: Rollup | None = None,
               snap: bool = False, span: dt.timedelta | None = None,
               interval: Callable[[TimeRange], float | None] | None = None) -> list[dict[str, Any]]:
    """``read`` (a series query) for the whole run, or its last ``span`` (``None``: the whole run), at
    the resolution that keeps ``series × buckets`` within ``cells`` (:func:`points_per_series`, the
    series as ``count`` counts them); with ``snap``, rounded down to the hour or minute rollup's grid
    when close to it (:func:`rollup_points`); with ``rollup``, on the rollup's grid when the raw rows
    would be too many (:func:`raw_budget_points`); with ``interval`` (the sampling interval of a
    range), at that interval when the raw rows fit (:func:`sampling_points`).

    The number of series is not known before reading them, so it is taken from a cheap probe (one
    bucket over the last :data:`PROBE` of data); series that had stopped by then are found in the
    full read, which is then repeated at the resolution that fits them all (rare: a rank or GPU
    that went silent minutes before the end)."""
    run = series.series_range(conn, table, cluster, job_id)
    if run is None:
        return []
    window = last(run, span)

    recent = read(conn, cluster, job_id, start=max(window.start, window.end - PROBE), end=window.end, points=1)
    every = interval(window) if interval is not None else None  # before fit(): one query, not one a fit

    def fit(found: int) -> int:
        points = points_per_series(cells, found, most)
        if every is not None and rollup is not None:
            points = sampling_points(window, points, every, raw_rows(window, recent, rollup))
        points = rollup_points(window, points) if snap else points
        return raw_budget_points(window, points, recent, rollup) if rollup else points

    guess = count(recent)
    points = fit(guess)
    rows = read(conn, cluster, job_id, start=window.start, end=window.end, points=points)
    found = count(rows)
    if found > guess and (fitted := fit(found)) < points:
        rows = read(conn, cluster, job_id, start=window.start, end=window.end, points=fitted)
    return rows


def read_gpu_grid(conn: Connection, cluster: str, job_id: str, cells: int, most: int, *,
                  span: dt.timedelta | None = None,
                  measures: series.GpuMeasures = series.GPU_MEASURES) -> list[dict[str, Any]]:
    """Every GPU's series over the whole run, or its last ``span`` (the page's time window): ``cells //
    GPUs`` buckets each (at most ``most``, at times fewer to read the per-hour or per-minute rollup), the
    heatmap's cells. A window (or a whole run) of few samples, within :data:`RAW_ROWS_MAX`, is read at
    the sampling interval (:func:`sampling_points`): a cell a sample, past ``cells`` if need be.
    ``measures``: which of the series' measures to compute (:func:`series.gpu_series`)."""

    return _read_gpus(conn, functools.partial(series.gpu_series, measures=measures), cluster, job_id, cells, most,
                      span)


def read_gpu_grid_by_gpu(conn: Connection, cluster: str, job_id: str, cells: int, most: int, *,
                         span: dt.timedelta | None = None,
                         measures: series.GpuMeasures = series.GPU_MEASURES) -> list[dict[str, Any]]:
    """:func:`read_gpu_grid`'s buckets as a row a GPU, its buckets and values as arrays
    (:func:`series.gpu_series_by_gpu`): what a page turns into a frame column by column."""
    return _read_gpus(conn, functools.partial(series.gpu_series_by_gpu, measures=measures), cluster, job_id, cells,
                      most, span)


def _read_gpus(conn: Connection, read: Callable[..., list[dict[str, Any]]], cluster: str, job_id: str, cells: int,
               most: int, span: dt.timedelta | None) -> list[dict[str, Any]]:
    """The GPU grid's rules (:func:`read_gpu_grid`) over ``read``, a GPU series query: its rows, or a GPU's
    row, name the GPU (node, index, MIG device), its first ``bucket`` and its ``samples``."""

    def interval(window: TimeRange) -> float | None:
        return sampling.sampling_interval(conn, cluster, job_id, window)

    return _read_grid(conn, read, "gpu_samples", _distinct("node", "gpu_index", "mig_uuid"), cluster,
                      job_id, cells, most, rollup=GPU_ROLLUP, snap=True, span=span, interval=interval)


def read_step_grid(conn: Connection, cluster: str, job_id: str, cells: int, most: int, *,
                   span: dt.timedelta | None = None) -> list[dict[str, Any]]:
    """Every rank's step series over the whole run, or its last ``span``: ``cells // ranks`` buckets each
    (at most ``most``), what the step band is computed from, read at the heatmap's budget so a
    rank-per-GPU job gets the same buckets."""
    return _read_grid(conn, series.step_series, "steps", _distinct("rank"), cluster, job_id, cells, most,
                      rollup=STEP_ROLLUP, span=span)


def read_metric_grid(conn: Connection, cluster: str, job_id: str, points: int, most: int, *,
                     span: dt.timedelta | None = None) -> list[dict[str, Any]]:
    """Every metric of every rank that logs it, over the whole run or its last ``span``, a chart's worth
    each: ``points // ranks`` buckets a rank (at most ``most``), for the metric logged by most ranks. One
    rank (the usual rank-zero logging) gets ``most``; a metric every rank of a big job logs does not bring
    back ranks × ``most``."""
    return _read_grid(conn, series.metric_series, "metrics", _most_ranks_per_metric, cluster, job_id, points, most,
                      span=span)
