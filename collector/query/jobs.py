"""Reads of jobs: the job list with its filters and a job's row with its summary."""

from __future__ import annotations

import datetime as dt
from typing import Any

from jobsight.collector.query.energy_so_far import energy_kwh_sql
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import reads as tiers

LIVE_UTIL_WINDOW = dt.timedelta(hours=1)
MAX_PAGE = 1000


def list_jobs(
    conn: Connection,
    *,
    cluster: str | None = None,
    job_id: str | None = None,
    user: str | None = None,
    state: str | None = None,
    partition: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    max_mean_util: float | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """Jobs matching the filters, running first then newest first, and the total count.

    ``since``/``until`` select jobs whose run overlaps the range. ``mean_util`` is the
    summary's for an ended job and, for a running job, the mean over its last
    :data:`LIVE_UTIL_WINDOW` from the per-minute rollup (``mean_util_live`` says which), so
    idle allocations show while they still hold their GPUs. ``max_mean_util`` keeps jobs
    below it; jobs with neither figure are left out by that filter. ``job_id`` finds one id in every
    cluster that holds it (``jobsight report`` names them when the one it asked has none).
    ``energy_kwh`` is a running job's energy so far (``energy_growing``) where it has no summary yet;
    ``attrs`` holds only ``process`` (the owner of a run outside Slurm, for its user's name).
    """
    where = ["true"]
    params: dict[str, Any] = {"live_window": LIVE_UTIL_WINDOW}
    filters = (("j.cluster", cluster), ("j.job_id", job_id), ("j.user_name", user), ("j.state", state),
               ("j.partition", partition))
    for column, value in filters:
        if value is not None:
            key = column.split(".")[1]
            where.append(f"{column} = %({key})s")
            params[key] = value
    if since is not None:
        where.append("coalesce(j.end_time, 'infinity') >= %(since)s")
        params["since"] = since
    if until is not None:
        where.append("j.start_time <= %(until)s")
        params["until"] = until
    if max_mean_util is not None:
        where.append("coalesce(s.mean_util, live.util) < %(max_mean_util)s")
        params["max_mean_util"] = max_mean_util
    clause = " AND ".join(where)
    joins = f"""FROM jobs j LEFT JOIN job_summaries s ON s.cluster = j.cluster AND s.job_id = j.job_id
               LEFT JOIN LATERAL (
                   SELECT sum(m.util_gpu_sum) / nullif(sum(m.util_gpu_n), 0) AS util FROM {_LIVE_MINUTES} m
               ) live ON j.state = 'running' AND s.job_id IS NULL"""
    base = f"{joins}\n               WHERE {clause}"
    total = conn.execute(f"SELECT count(*) AS n {base}", params).fetchone()
    params.update(limit=min(max(limit, 1), MAX_PAGE), offset=max(offset, 0))
    # A running job's energy so far, joined as the audit joins it (a lateral read of the hourly rollup on
    # the job's own id, skipped for every other job); not in the count, which needs none.
    rows = conn.execute(
        f"""SELECT j.cluster, j.job_id, j.user_name, j.account, j.partition, j.name, j.nodes, j.node_count,
                   j.gpus, j.start_time, j.end_time, j.state, j.exit_code, j.demo, j.last_seen, j.run,
                   s.gpu_count, s.gpu_hours, coalesce(s.mean_util, live.util) AS mean_util,
                   s.mean_util IS NULL AND live.util IS NOT NULL AS mean_util_live,
                   coalesce(s.energy_kwh, live_energy.energy_kwh) AS energy_kwh,
                   s.energy_kwh IS NULL AND live_energy.energy_kwh IS NOT NULL AS energy_growing, s.flags,
                   jsonb_build_object('process', j.attrs -> 'process') AS attrs
            {joins} LEFT JOIN LATERAL {_LIVE_ENERGY} live_energy ON true
            WHERE {clause}
            ORDER BY (j.state = 'running') DESC, j.start_time DESC NULLS LAST, j.job_id
            LIMIT %(limit)s OFFSET %(offset)s""",
        params,
    ).fetchall()
    return rows, int(total["n"]) if total else 0


_LIVE_MINUTES = tiers.minutes(
    ("util_gpu_sum", "util_gpu_n"), job="j.job_id", cluster="j.cluster", start="now() - %(live_window)s"
)


# A running job's energy so far (from the hourly rollup), read only for a running job with no summary.
_LIVE_ENERGY = energy_kwh_sql("j.job_id", "j.cluster", only_if="s.job_id IS NULL AND j.state = 'running'")


def get_job(conn: Connection, cluster: str, job_id: str) -> dict[str, Any] | None:
    """The job's row with its summary, or ``None`` when the collector has never seen it."""
    return conn.execute(
        """SELECT j.*, s.summary, s.gpu_count, s.gpu_hours, s.mean_util, s.energy_kwh, s.flags
           FROM jobs j LEFT JOIN job_summaries s ON s.cluster = j.cluster AND s.job_id = j.job_id
           WHERE j.cluster = %s AND j.job_id = %s""",
        (cluster, job_id),
    ).fetchone()
