"""How often a job's GPUs were sampled, as its data says.

Node daemons sample every second by default, but sites that scrape GPU metrics for Prometheus do
so every 15 to 60 s, and the chart query must never cut buckets narrower than that: a 15 s series
in 1.5 s buckets is one bucket in ten with data, which a line chart draws as scattered marks.

The interval is measured on the per-minute rollup, which both storage tiers keep and which holds
each minute's sample count and last sample time: the span from the previous minute's last sample
to this minute's, over this minute's samples, is the mean spacing of those samples (a minute of a
15 s series: 60 s over 4). A minute after an outage gives one large spacing, which the median over
the GPU's minutes ignores. Reading a GPU's minutes costs one row a minute whatever the interval.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from jobsight.collector.query.time_range import TimeRange
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import reads as tiers

PROBE: Final = dt.timedelta(minutes=10)
"""The part of a window, at its end, that the interval is measured on: ten rows a GPU (13 ms for a
512-GPU job), a steady median for any interval up to a few minutes. A window whose probe holds no two
samples of a GPU is measured over all of it."""

_SPACINGS: Final = f"""
SELECT max(interval_s) AS interval_s FROM (
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY spacing_s) AS interval_s
    FROM (
        SELECT node, gpu_index, mig_uuid,
               extract(epoch FROM last_ts - lag(last_ts) OVER (PARTITION BY node, gpu_index, mig_uuid ORDER BY ts))
                   ::float8 / samples AS spacing_s
        FROM (
            -- A minute that got late samples after its day was packed has a row in each tier.
            SELECT ts, node, gpu_index, mig_uuid, sum(samples) AS samples, max(last_ts) AS last_ts
            FROM {tiers.minutes(("samples", "last_ts"), start="%(start)s", end="%(end)s")} m
            GROUP BY ts, node, gpu_index, mig_uuid
        ) minutes
    ) spacings
    WHERE spacing_s > 0
    GROUP BY node, gpu_index, mig_uuid
) per_gpu
"""


def sampling_interval(conn: Connection, cluster: str, job_id: str, window: TimeRange) -> float | None:
    """Seconds between a GPU's samples in ``window``: per GPU the median spacing of its samples over
    the window's last :data:`PROBE` (all of the window when that finds none), the largest over the
    job's GPUs, so that a bucket as wide holds a sample of every GPU.

    ``None`` when no GPU has samples in two minutes of the window, or the job has no minute rollup
    (jobs stored before it existed): the caller then knows nothing of the interval."""
    probe_start = max(window.start, window.end - PROBE)
    starts = [probe_start] if probe_start <= window.start else [probe_start, window.start]
    for start in starts:
        # From the start of its minute: that minute's row holds the window's first samples.
        params = {"job": job_id, "cluster": cluster, "start": start.replace(second=0, microsecond=0),
                  "end": window.end}
        row = conn.execute(_SPACINGS, params).fetchone()
        if row is not None and row["interval_s"] is not None:
            return float(row["interval_s"])
    return None
