"""Every read query, shared by the read API and the dashboard (which must not write SQL).

Series are downsampled in SQL with ``date_bin`` so no caller ever pulls raw rows for a
chart: a series of any length comes back as at most ``points`` buckets. GPU samples and the
per-minute rollup are read from both storage tiers (:mod:`jobsight.collector.tiers.reads`): a job
whose closed hours were packed gives the answers it gave before. The per-hour rollup
(``gpu_hours``) has one tier: compaction leaves it as it is. Step charts and epoch markers
read the step rollup (:mod:`jobsight.collector.tiers.step_rollup`) rather than a row per step per rank.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Final

from psycopg.pq import TransactionStatus

from jobsight.collector.query import sampling
from jobsight.collector.query.time_range import TimeRange
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import host_tier, step_rollup
from jobsight.collector.tiers import reads as tiers

MAX_POINTS = 5000


def series_range(conn: Connection, table: str, cluster: str, job_id: str) -> TimeRange | None:
    """First and last timestamp of a job's rows in ``table``; ``None`` when it has none."""
    if table not in ("gpu_samples", "host_samples", "metrics", "steps", "log_events"):
        raise ValueError(f"not a series table: {table}")
    tiered = {"gpu_samples": tiers.SAMPLE_RANGE, "host_samples": host_tier.RANGE}
    query = tiered.get(table) or (
        f"SELECT min(ts) AS start, max(ts) AS end FROM {table} WHERE job_id = %(job)s AND cluster = %(cluster)s"
    )
    row = conn.execute(query, {"job": job_id, "cluster": cluster}).fetchone()
    if row is None or row["start"] is None:
        return None
    return TimeRange(row["start"], row["end"])


def _resolve_range(
    conn: Connection, table: str, cluster: str, job_id: str, start: dt.datetime | None, end: dt.datetime | None
) -> TimeRange | None:
    if start is not None and end is not None:
        return TimeRange(start, end)
    found = series_range(conn, table, cluster, job_id)
    if found is None:
        return None
    if start is None:
        # A requeued job's latest run by default (collector/jobs/job_runs.py): its earlier runs' rows stay apart.
        run = conn.execute("SELECT run_start FROM jobs WHERE cluster = %s AND job_id = %s AND run > 0",
                           (cluster, job_id)).fetchone()
        if run is not None and run["run_start"] is not None and run["run_start"] > found.start:
            start = min(run["run_start"], found.end)
    return TimeRange(start or found.start, end or found.end)


GpuMeasures = tuple[str, ...]
"""Which of a GPU series' measures a read computes (:data:`GPU_MEASURES`' names, in any order)."""

_AGGREGATES: Final = {
    # measure: (its aggregate over samples, its aggregate over a rollup's columns, those columns)
    "util_gpu": ("avg(util_gpu)", "sum(util_gpu_sum) / nullif(sum(util_gpu_n), 0)", ("util_gpu_sum", "util_gpu_n")),
    "util_mem": ("avg(util_mem)", "sum(util_mem_sum) / nullif(sum(util_mem_n), 0)", ("util_mem_sum", "util_mem_n")),
    "mem_used": ("max(mem_used)", "max(mem_used_max)", ("mem_used_max",)),
    "mem_total": ("max(mem_total)", "max(mem_total_max)", ("mem_total_max",)),
    "power_w": ("avg(power_w)", "sum(power_sum) / nullif(sum(power_n), 0)", ("power_sum", "power_n")),
    "temp_c": ("avg(temp_c)", "sum(temp_sum) / nullif(sum(temp_n), 0)", ("temp_sum", "temp_n")),
    "energy_j": ("max(energy_j)", "max(energy_max)", ("energy_max",)),
}

GPU_MEASURES: Final[GpuMeasures] = tuple(_AGGREGATES)
"""Every measure of a GPU series: what the read API returns and a node's lines draw."""

UTILISATION: Final[GpuMeasures] = ("util_gpu",)
"""The heatmap's one measure. Reading it alone is a third less of the database's time for a 64-GPU
job's recent window, and fewer columns to fetch and turn into a frame (docs/scale.md)."""


def _measures(measures: GpuMeasures) -> GpuMeasures:
    unknown = set(measures) - set(_AGGREGATES)
    if unknown:
        raise ValueError(f"not a GPU measure: {', '.join(sorted(unknown))}")
    return tuple(m for m in GPU_MEASURES if m in measures)  # one statement text for one set


def _samples_statement(measures: GpuMeasures) -> str:
    aggregates = "".join(f"{_AGGREGATES[m][0]} AS {m}, " for m in measures)
    return f"""
SELECT node, gpu_index, gpu_uuid, mig_uuid,
       date_bin(make_interval(secs => %(width)s), ts, %(origin)s) AS bucket,
       %(width)s::float8 AS bucket_s, %(interval)s::float8 AS interval_s,
       {aggregates}bool_or(lost) AS lost, count(*) AS samples
FROM {tiers.samples((*measures, "lost"), start="%(start)s", end="%(end)s")} s
GROUP BY node, gpu_index, gpu_uuid, mig_uuid, bucket
ORDER BY node, gpu_index, mig_uuid NULLS FIRST, bucket
"""


def _rollup_columns(measures: GpuMeasures) -> tuple[str, ...]:
    return ("gpu_uuid", *(column for m in measures for column in _AGGREGATES[m][2]), "lost", "samples")


def _from_rollup(bucket_of: str, rows: str, measures: GpuMeasures) -> str:
    """A GPU series from rollup ``rows`` (a table, or a parenthesised SELECT with an alias), each
    row in the bucket of ``bucket_of`` (SQL on its ``ts``): the columns of :func:`_samples_statement`."""
    aggregates = "".join(f"{_AGGREGATES[m][1]} AS {m}, " for m in measures)
    return f"""
SELECT nullif(node, '') AS node, gpu_index, min(gpu_uuid) AS gpu_uuid, nullif(mig_uuid, '') AS mig_uuid,
       date_bin(make_interval(secs => %(width)s), {bucket_of}, %(origin)s) AS bucket,
       %(width)s::float8 AS bucket_s, %(interval)s::float8 AS interval_s,
       {aggregates}bool_or(lost) AS lost, sum(samples) AS samples
FROM {rows}
GROUP BY node, gpu_index, mig_uuid, bucket
ORDER BY node, gpu_index, mig_uuid, bucket
"""


def _minutes_statement(measures: GpuMeasures) -> str:
    return _from_rollup("ts", f"{tiers.minutes(_rollup_columns(measures), start='%(origin)s', end='%(end)s')} m",
                        measures)


# An hour goes to the bucket that holds its middle (or the window's end, if that comes first):
# TimeRange.bucket_seconds makes buckets a microsecond wider than whole hours (7200.000001 s), so
# an hour that starts a bucket would go by its start to the bucket before, with all its samples.
# Over buckets of whole hours, the middle's bucket is that of each of the hour's minutes.
def _hours_statement(measures: GpuMeasures) -> str:
    return _from_rollup(
        "least(ts + interval '30 minutes', %(end)s)",
        """gpu_hours h WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= %(origin)s AND ts <= %(end)s""",
        measures,
    )


GPU_FROM_SAMPLES: Final = _samples_statement(GPU_MEASURES)
GPU_FROM_MINUTES: Final = _minutes_statement(GPU_MEASURES)
GPU_FROM_HOURS: Final = _hours_statement(GPU_MEASURES)
_STATEMENTS: Final = {GPU_MEASURES: (GPU_FROM_HOURS, GPU_FROM_MINUTES, GPU_FROM_SAMPLES)}


def _statements(measures: GpuMeasures) -> tuple[str, str, str]:
    """The hour rollup's, the minute rollup's and the samples' statement for ``measures``, each built once."""
    found = _STATEMENTS.get(measures)
    if found is None:
        found = _STATEMENTS[measures] = (_hours_statement(measures), _minutes_statement(measures),
                                         _samples_statement(measures))
    return found


CHART_SETTINGS = {
    # 64 GPUs x 600 buckets are ~40 k groups: in the default 4 MB they spill to disk (twice:
    # the hash, then the sort).
    "work_mem": "32MB",
    # Under a Gather the planner does not count the rows that unnested packed arrays give, so
    # it funnels every minute of a long job to the leader instead of aggregating in the
    # workers: slower than one process.
    "max_parallel_workers_per_gather": "0",
}
"""Planner settings for a GPU chart's statements."""
_SET_CHART_SETTINGS: Final = "SELECT " + ", ".join(f"set_config('{name}', %({name})s, true)" for name in CHART_SETTINGS)

# Buckets at least this wide read the per-minute rollup: each then holds two or more
# whole minutes, so no bucket is left empty by the coarser grain.
ROLLUP_MIN_BUCKET_S = 120.0
# Buckets at least this wide read the per-hour rollup, by the same rule.
HOUR_ROLLUP_MIN_BUCKET_S = 7200.0


def gpu_series(
    conn: Connection,
    cluster: str,
    job_id: str,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    points: int = 500,
    measures: GpuMeasures = GPU_MEASURES,
) -> list[dict[str, Any]]:
    """Per GPU (node, index, MIG device) and time bucket: mean utilisation, max memory,
    mean power and temperature (``measures``: those of :data:`GPU_MEASURES` named, all by default;
    every row also says whether a sample in it was lost and how many it holds). At most ``points``
    buckets per GPU.

    A bucket is never narrower than the job's sampling interval
    (:func:`jobsight.collector.query.sampling.sampling_interval`), so that a GPU sampled every 15 s has a
    sample in every bucket rather than in one of ten; every row says its bucket's width
    (``bucket_s``) and the interval found (``interval_s``, ``None`` when unknown). Buckets that
    would be under two intervals wide are a whole number of intervals instead, centred on the
    samples (the first starts half an interval before the window).

    Wide buckets come from the rollups: two hours or more from the per-hour one (a 9-day job
    reads thousands of rows), two minutes or more from the per-minute one (a 24-hour job never
    reads its samples). A rollup counts whole hours or minutes: a window that starts or ends
    inside one takes all of it. A job with no rollup rows (ingested before the rollup existed)
    reads the samples.
    """
    return _read_gpu_statements(conn, gpu_series_statements(conn, cluster, job_id, start=start, end=end,
                                                            points=points, measures=measures))


def gpu_series_by_gpu(
    conn: Connection,
    cluster: str,
    job_id: str,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    points: int = 500,
    measures: GpuMeasures = GPU_MEASURES,
) -> list[dict[str, Any]]:
    """:func:`gpu_series` as a row a GPU: its ``node``, ``gpu_index`` and ``mig_uuid``; its first
    ``bucket`` and the ``samples`` of all its buckets (what a grid's probe counts); ``bucket_s`` and
    ``interval_s``; and, in bucket order, each bucket's start in microseconds since the epoch
    (``bucket_us``) and each of ``measures``, an array each. The same buckets and values as
    :func:`gpu_series`'s rows, which a page would otherwise turn into Python objects one value at a time:
    a 64-GPU job's recent window is 8,000 rows of ten columns (docs/scale.md)."""
    statements = gpu_series_statements(conn, cluster, job_id, start=start, end=end, points=points,
                                       measures=measures)
    by_gpu = _by_gpu_statement(_measures(measures))
    return _read_gpu_statements(conn, [(by_gpu.format(rows=_unordered(query)), params)
                                       for query, params in statements])


def _by_gpu_statement(measures: GpuMeasures) -> str:
    """A GPU series' rows (``{rows}``, a statement of :func:`gpu_series_statements`) as a row a GPU."""
    arrays = "".join(f",\n       array_agg({m} ORDER BY bucket) AS {m}" for m in measures)
    return f"""
SELECT node, gpu_index, mig_uuid, min(bucket) AS bucket, sum(samples) AS samples,
       min(bucket_s) AS bucket_s, min(interval_s) AS interval_s,
       array_agg((extract(epoch FROM bucket) * 1000000)::int8 ORDER BY bucket) AS bucket_us{arrays}
FROM ({{rows}}) g
GROUP BY node, gpu_index, mig_uuid
ORDER BY node, gpu_index, mig_uuid NULLS FIRST
"""


def _unordered(query: str) -> str:
    """A GPU statement without its final ``ORDER BY`` (the rows are ordered again, a GPU's in its arrays)."""
    body, _, order = query.rpartition("ORDER BY")
    if not body or ")" in order:
        raise ValueError("not a GPU series statement: it does not end in ORDER BY")
    return body


def _read_gpu_statements(conn: Connection, statements: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of the first of a GPU chart's ``statements`` that returns any, under :data:`CHART_SETTINGS`."""
    if statements and (not conn.autocommit or conn.info.transaction_status == TransactionStatus.INTRANS):
        # For this transaction only (the API's or the dashboard's unit of work), see CHART_SETTINGS; in
        # one statement, as every round trip is a page's wait.
        conn.execute(_SET_CHART_SETTINGS, CHART_SETTINGS)
    return first_with_rows(conn, statements)


def first_with_rows(conn: Connection, statements: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of the first statement that returns any (a rollup, then a finer grain for the
    jobs the rollup does not hold); none when no statement does."""
    for query, params in statements:
        rows = conn.execute(query, params).fetchall()
        if rows:
            return rows
    return []


def gpu_series_statements(
    conn: Connection,
    cluster: str,
    job_id: str,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    points: int = 500,
    measures: GpuMeasures = GPU_MEASURES,
) -> list[tuple[str, dict[str, Any]]]:
    """The statements :func:`gpu_series` runs, in order, until one returns rows: the hour
    rollup's and the minute rollup's when the buckets are wide enough for them, then the
    samples'; only the samples' when ``points`` buckets would be under two sampling intervals
    wide. All give the same columns. (Tests EXPLAIN them.)"""
    from_hours, from_minutes, from_samples = _statements(_measures(measures))
    points = min(max(points, 1), MAX_POINTS)
    window = _resolve_range(conn, "gpu_samples", cluster, job_id, start, end)
    if window is None:
        return []
    interval = sampling.sampling_interval(conn, cluster, job_id, window)
    grid, width = _sample_buckets(window, points, interval)
    samples = (from_samples, _bucket_params(grid, window, width, interval, job_id, cluster))
    if interval is not None and window.bucket_seconds(points) < 2 * interval:
        # A sample or two a bucket: the samples are no more rows than the buckets, and a rollup, which
        # places each sample at its minute's or hour's start, would fill such buckets unevenly.
        return [samples]
    grains = zip(rollup_grains(window), (from_hours, from_minutes), strict=True)
    rollups = [(query, _bucket_params(aligned, window, aligned.bucket_seconds(points), interval, job_id, cluster))
               for (aligned, least), query in grains if aligned.bucket_seconds(points) >= least]
    return [*rollups, samples]


def rollup_grains(window: TimeRange) -> tuple[tuple[TimeRange, float], ...]:
    """The GPU rollups ``window`` can be read from, hours then minutes: each as the window from the start
    of its first hour or minute (what the rollup's buckets align to) and the narrowest bucket, in
    seconds, that reads it. The one statement of the grain rule: :func:`gpu_series_statements` reads
    a rollup by it, and the chart grids (:mod:`jobsight.collector.query.grids`) fit their buckets to it."""
    return ((window.from_hour(), HOUR_ROLLUP_MIN_BUCKET_S), (window.from_minute(), ROLLUP_MIN_BUCKET_S))


def _sample_buckets(window: TimeRange, points: int, interval: float | None) -> tuple[TimeRange, float]:
    """The samples' buckets: the range whose start is their origin, and their width in seconds.

    Buckets ``points`` make of the window, when they are two sampling intervals wide or more (or the
    interval is not known). Narrower, they would be one interval and a hair, and as the hair adds up
    along the run, samples would reach a bucket's edge, where one a millisecond early leaves its own
    bucket empty and the next with two: holes in the heatmap and lone points in a line. So they are
    the fewest whole intervals that keep to ``points`` (one, or two), from half an interval before
    the window: each sample sits mid-bucket, whatever its jitter."""
    if interval is None or window.bucket_seconds(points) >= 2 * interval:
        return window, window.bucket_seconds(points)
    centred = TimeRange(window.start - dt.timedelta(seconds=interval / 2), window.end)
    width = interval * math.ceil(centred.bucket_seconds(points) / interval)
    return centred, math.ceil(width * 1e6) / 1e6  # whole microseconds, as date_bin takes it: the rows say it exactly


def _bucket_params(grid: TimeRange, window: TimeRange, width: float, interval: float | None, job_id: str,
                   cluster: str) -> dict[str, Any]:
    """Buckets of ``width`` seconds from ``grid``'s start (their origin) over ``window``."""
    return {"width": width, "interval": interval, "origin": grid.start, "start": window.start, "end": window.end,
            "job": job_id, "cluster": cluster}


def metric_series(
    conn: Connection,
    cluster: str,
    job_id: str,
    *,
    name: str | None = None,
    rank: int | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    points: int = 500,
) -> list[dict[str, Any]]:
    """Per metric name and rank and time bucket: mean, min, max and last step."""
    points = min(max(points, 1), MAX_POINTS)
    window = _resolve_range(conn, "metrics", cluster, job_id, start, end)
    if window is None:
        return []
    return conn.execute(
        """SELECT name, rank, date_bin(make_interval(secs => %(width)s), ts, %(origin)s) AS bucket,
                  avg(value) AS value, min(value) AS min, max(value) AS max, max(step) AS step,
                  count(*) AS samples
           FROM metrics
           WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= %(origin)s AND ts <= %(end)s
             AND (%(name)s::text IS NULL OR name = %(name)s)
             AND (%(rank)s::int IS NULL OR rank = %(rank)s)
           GROUP BY name, rank, bucket
           ORDER BY name, rank NULLS FIRST, bucket""",
        {
            "width": window.bucket_seconds(points),
            "origin": window.start,
            "end": window.end,
            "job": job_id,
            "cluster": cluster,
            "name": name,
            "rank": rank,
        },
    ).fetchall()


def metric_names(conn: Connection, cluster: str, job_id: str) -> list[str]:
    rows = conn.execute(
        "SELECT DISTINCT name FROM metrics WHERE job_id = %s AND cluster = %s ORDER BY name", (job_id, cluster)
    ).fetchall()
    return [r["name"] for r in rows]


# Step buckets at least a minute wide read the per-rank minute rollup: every bucket then holds
# at least one minute's midpoint, so none is left empty by the coarser grain.
STEP_ROLLUP_MIN_BUCKET_S = 60.0


def step_series(
    conn: Connection,
    cluster: str,
    job_id: str,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    points: int = 500,
) -> list[dict[str, Any]]:
    """Per rank and time bucket of training steps: mean and max step time, data-wait share,
    steps and samples, last step and epoch.

    Buckets of a minute or more come from the per-rank minute rollup (a 512-rank job never
    reads its steps); a job with no rollup rows (ingested before the rollup existed) reads the
    steps."""
    return first_with_rows(conn, step_series_statements(conn, cluster, job_id, start=start, end=end, points=points))


def step_series_statements(
    conn: Connection,
    cluster: str,
    job_id: str,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    points: int = 500,
) -> list[tuple[str, dict[str, Any]]]:
    """The statements :func:`step_series` runs, in order, until one returns rows: the rollup's
    when the buckets are wide enough, then the steps'. Both take the same parameters and give
    the same columns; over buckets that start and end on whole minutes, the same values."""
    points = min(max(points, 1), MAX_POINTS)
    window = _resolve_range(conn, "steps", cluster, job_id, start, end)
    if window is None:
        return []
    statements: list[tuple[str, dict[str, Any]]] = []
    params = {"job": job_id, "cluster": cluster, "end": window.end}
    minute_window = window.from_minute()
    if minute_window.bucket_seconds(points) >= STEP_ROLLUP_MIN_BUCKET_S:
        statements.append((STEPS_FROM_MINUTES, {
            **params, "width": minute_window.bucket_seconds(points), "origin": minute_window.start}))
    statements.append((STEPS_FROM_ROWS, {**params, "width": window.bucket_seconds(points), "origin": window.start}))
    return statements


STEPS_FROM_ROWS = """
SELECT rank, date_bin(make_interval(secs => %(width)s), ts, %(origin)s) AS bucket,
       avg(duration_s) AS duration_s, max(duration_s) AS max_duration_s,
       sum(data_wait_s) / nullif(sum(duration_s), 0) AS data_wait_share,
       count(*) AS steps, sum(samples) AS samples, max(step) AS last_step, max(epoch) AS epoch,
       CASE WHEN count(forward_s) = count(*) THEN avg(coalesce(data_wait_s, 0) + forward_s) END AS own_s
FROM steps
WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= %(origin)s AND ts <= %(end)s
  AND coalesce(phase, 'train') = 'train'
GROUP BY rank, bucket
ORDER BY rank NULLS FIRST, bucket
"""

# A minute goes to the bucket that holds its middle (or the window's end, if that comes first):
# the one that holds most of its steps when the buckets do not fall on whole minutes (a width of
# 120.000001 s, as TimeRange.bucket_seconds gives, would put a minute's start in the bucket before
# its steps'); when they do, the bucket of every one of its steps.
STEPS_FROM_MINUTES = f"""
SELECT nullif(rank, {step_rollup.NO_RANK}) AS rank,
       date_bin(make_interval(secs => %(width)s), least(ts + interval '30 seconds', %(end)s), %(origin)s) AS bucket,
       sum(duration_sum) / sum(steps) AS duration_s, max(duration_max) AS max_duration_s,
       sum(data_wait_sum) / nullif(sum(duration_sum), 0) AS data_wait_share,
       sum(steps) AS steps, sum(samples_sum)::int8 AS samples, max(last_step) AS last_step, max(epoch) AS epoch,
       CASE WHEN sum(forward_n) = sum(steps) THEN sum(coalesce(data_wait_sum, 0) + forward_sum) / sum(steps) END
           AS own_s
FROM step_minutes
WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= %(origin)s AND ts <= %(end)s
GROUP BY step_minutes.rank, bucket
ORDER BY rank NULLS FIRST, bucket
"""


def epoch_starts(conn: Connection, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """When each training epoch began (its first step record), for timeline markers. A job
    ingested before the step rollup existed (no ``step_minutes`` rows) is read from its steps."""
    params = {"job": job_id, "cluster": cluster}
    rows = conn.execute(_EPOCH_STARTS, params).fetchall()
    if rows or conn.execute(_HAS_STEP_MINUTES, params).fetchone() is not None:
        return rows
    return conn.execute(_EPOCH_STARTS_FROM_STEPS, params).fetchall()


_EPOCH_STARTS = """SELECT epoch, ts FROM epoch_starts WHERE job_id = %(job)s AND cluster = %(cluster)s
                   ORDER BY epoch"""
_HAS_STEP_MINUTES = "SELECT 1 FROM step_minutes WHERE job_id = %(job)s AND cluster = %(cluster)s LIMIT 1"
_EPOCH_STARTS_FROM_STEPS = """
SELECT epoch, min(ts) AS ts FROM steps
WHERE job_id = %(job)s AND cluster = %(cluster)s AND epoch IS NOT NULL AND coalesce(phase, 'train') = 'train'
GROUP BY epoch ORDER BY epoch
"""


def recent_train_steps(conn: Connection, cluster: str, job_id: str, *, limit: int = 5000) -> list[dict[str, Any]]:
    """The job's latest ``limit`` training steps on every rank (rank, duration, data wait, forward),
    newest first: what the job-wide diagnosis looks at."""
    return conn.execute(
        """SELECT rank, duration_s, data_wait_s, forward_s FROM steps
           WHERE job_id = %s AND cluster = %s AND coalesce(phase, 'train') = 'train'
           ORDER BY ts DESC LIMIT %s""",
        (job_id, cluster, limit),
    ).fetchall()


def recent_gpu_samples(conn: Connection, cluster: str, job_id: str, *, limit: int = 2000) -> list[dict[str, Any]]:
    """The job's latest ``limit`` GPU samples (utilisation, memory used and total), newest first."""
    return conn.execute(_RECENT_GPU_SAMPLES, {"job": job_id, "cluster": cluster, "limit": limit}).fetchall()


_RECENT_GPU_SAMPLES = tiers.latest_samples(("util_gpu", "mem_used", "mem_total"))
