"""Read queries for the admin audit: GPU-hours, idle allocations, energy, trend.

A job's GPU-hours in a period are its allocated GPUs times the overlap of its run with
the period, so a job that straddles the period's edge counts only its inside part; a
running job runs until ``now``. Allocated GPUs are the job's ``node:index`` list from the
prolog, or the summary's GPU count when no prolog reported. Energy comes from job
summaries (computed at job end) and is pro-rated by the same overlap; a running job has no
summary yet, so its energy so far is read from the hourly rollup
(:mod:`jobsight.collector.query.energy_so_far`), and the rows that count one say so
(``running_jobs``): their energy is still growing. The GPU-hours of jobs ended at their time
limit and of cancelled jobs are counted apart as well, by the state Slurm named.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from jobsight.collector.jobs.node_energy import J_PER_KWH
from jobsight.collector.query.energy_so_far import energy_kwh_sql
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import host_tier
from jobsight.rules import job_states

GroupBy = Literal["user_name", "account", "partition"]
_GROUPS = ("user_name", "account", "partition")


# A running job's energy so far: read only for jobs with no summary that have not ended.
_LIVE_ENERGY = energy_kwh_sql("j.job_id", "j.cluster", only_if="s.job_id IS NULL AND j.end_time IS NULL")
# Its share of its nodes' energy so far (a condition on the outer row alone is tested once, first).
_LIVE_NODE_ENERGY = f"""(SELECT sum(energy_j) / {J_PER_KWH} AS energy_kwh
    FROM {host_tier.samples(job="j.job_id", cluster="j.cluster")} h WHERE s.job_id IS NULL AND j.end_time IS NULL)"""


def _allocations(cluster: str | None) -> str:
    """Per job overlapping the period: GPUs, overlap seconds, run seconds, whether it is running
    (its energy so far, still growing); parameters ``start``, ``end``, ``now`` and (when given)
    ``cluster``."""
    where = "AND j.cluster = %(cluster)s" if cluster is not None else ""
    return f"""
        SELECT j.cluster, j.job_id,
               -- A run outside Slurm has no prolog's user: its process's owner, as its page and the report
               -- name it (jobsight/rules/display_text.user).
               coalesce(j.user_name, j.attrs -> 'process' ->> 'user') AS user_name,
               j.account, j.partition, j.name, j.state, j.end_reason,
               j.start_time, j.end_time,
               coalesce(nullif(cardinality(j.gpus), 0), s.gpu_count, 0) AS gpus,
               s.mean_util, coalesce(s.energy_kwh, live.energy_kwh) AS energy_kwh, s.flags,
               coalesce(s.node_energy_kwh, live_node.energy_kwh) AS node_energy_kwh,
               -- Emissions: the emissions pass's for an ended job; so far, at the site's one figure, else.
               coalesce(s.co2e_kg, (coalesce(s.energy_kwh, live.energy_kwh, 0)
                                    + coalesce(s.node_energy_kwh, live_node.energy_kwh, 0))
                                   * %(co2e_per_kwh)s::float8) AS co2e_kg,
               s.job_id IS NULL AND j.end_time IS NULL AS running,
               greatest(j.start_time, %(start)s) AS seg_start,
               least(coalesce(j.end_time, %(now)s), %(end)s) AS seg_end,
               extract(epoch FROM least(coalesce(j.end_time, %(now)s), %(end)s)
                                  - greatest(j.start_time, %(start)s)) AS overlap_s,
               extract(epoch FROM coalesce(j.end_time, %(now)s) - j.start_time) AS run_s
        FROM jobs j LEFT JOIN job_summaries s ON s.cluster = j.cluster AND s.job_id = j.job_id
        LEFT JOIN LATERAL {_LIVE_ENERGY} live ON true
        LEFT JOIN LATERAL {_LIVE_NODE_ENERGY} live_node ON true
        WHERE j.start_time < %(end)s AND coalesce(j.end_time, %(now)s) > %(start)s {where}"""


# GPU-hours of jobs Slurm ended at their time limit, and of jobs cancelled (scancel): where most
# allocated GPU-hours are wasted. The state is the most specific one heard (jobsight/rules/job_states.py).
_ENDED_BY = f"""coalesce(sum(gpus * overlap_s) FILTER (WHERE state = '{job_states.TIMEOUT}'), 0) / 3600.0
                    AS timeout_gpu_hours,
                coalesce(sum(gpus * overlap_s) FILTER (WHERE state = '{job_states.CANCELLED}'), 0) / 3600.0
                    AS cancelled_gpu_hours"""


def _params(start: dt.datetime, end: dt.datetime, now: dt.datetime | None, cluster: str | None,
            co2e_per_kwh: float | None = None) -> dict[str, Any]:
    return {"start": start, "end": end, "now": now or dt.datetime.now(dt.UTC), "cluster": cluster,
            "co2e_per_kwh": co2e_per_kwh}


# Energy beside the GPUs' and emissions, pro-rated by the overlap as the GPUs' energy is.
_WHOLE = """sum(node_energy_kwh * overlap_s / nullif(run_s, 0)) AS node_energy_kwh,
            sum((coalesce(energy_kwh, 0) + coalesce(node_energy_kwh, 0)) * overlap_s / nullif(run_s, 0))
                FILTER (WHERE energy_kwh IS NOT NULL OR node_energy_kwh IS NOT NULL) AS total_energy_kwh,
            sum(co2e_kg * overlap_s / nullif(run_s, 0)) AS co2e_kg"""


def gpu_hours_by(
    conn: Connection,
    group_by: GroupBy,
    start: dt.datetime,
    end: dt.datetime,
    *,
    cluster: str | None = None,
    now: dt.datetime | None = None,
    co2e_per_kwh: float | None = None,
) -> list[dict[str, Any]]:
    """Per user, account or partition: jobs, GPU-hours, GPU-hour-weighted mean utilisation
    (over jobs with a summary), energy in kWh and its share of the period's energy, largest first,
    the energy beside the GPUs (``node_energy_kwh``), both (``total_energy_kwh``) and kg CO2e
    (``co2e_kg``: ended jobs' from their summaries, running ones' so far at ``co2e_per_kwh``, the
    site's kg per kWh with PUE; ``None`` where no job has a figure),
    ``running_jobs``: how many of its jobs still run, whose energy so far is counted (the
    figure is still growing where this is not 0), and ``timeout_gpu_hours``/``cancelled_gpu_hours``:
    the GPU-hours of its jobs that Slurm ended at their time limit, and of its cancelled jobs.
    A ``None`` group is a job whose prolog never reported that field."""
    if group_by not in _GROUPS:
        raise ValueError(f"cannot group by {group_by!r}")
    return conn.execute(
        f"""WITH a AS ({_allocations(cluster)}),
                 g AS (SELECT {group_by} AS name, count(*) AS jobs,
                              sum(gpus * overlap_s) / 3600.0 AS gpu_hours,
                              sum(gpus * overlap_s * mean_util) / nullif(sum(gpus * overlap_s)
                                  FILTER (WHERE mean_util IS NOT NULL), 0) AS mean_util,
                              sum(energy_kwh * overlap_s / nullif(run_s, 0)) AS energy_kwh,
                              count(*) FILTER (WHERE running) AS running_jobs,
                              {_ENDED_BY}, {_WHOLE}
                       FROM a GROUP BY {group_by})
            SELECT name, jobs, gpu_hours, mean_util, energy_kwh,
                   energy_kwh / nullif(sum(energy_kwh) OVER (), 0) AS energy_share, running_jobs,
                   timeout_gpu_hours, cancelled_gpu_hours, node_energy_kwh, total_energy_kwh, co2e_kg
            FROM g ORDER BY gpu_hours DESC NULLS LAST, name""",
        _params(start, end, now, cluster, co2e_per_kwh),
    ).fetchall()


def audit_totals(
    conn: Connection,
    start: dt.datetime,
    end: dt.datetime,
    *,
    cluster: str | None = None,
    now: dt.datetime | None = None,
    co2e_per_kwh: float | None = None,
) -> dict[str, Any]:
    """The period's jobs, GPU-hours, energy (kWh, running jobs' so far; ``node_energy_kwh``,
    ``total_energy_kwh`` and ``co2e_kg`` as :func:`gpu_hours_by` has them) and GPU-hour-weighted mean
    utilisation, ``running_jobs`` (the energy is still growing where this is not 0), and the GPU-hours
    of jobs ended at their time limit (``timeout_gpu_hours``) and of cancelled jobs (``cancelled_gpu_hours``)."""
    row = conn.execute(
        f"""WITH a AS ({_allocations(cluster)})
            SELECT count(*) AS jobs, coalesce(sum(gpus * overlap_s) / 3600.0, 0) AS gpu_hours,
                   coalesce(sum(energy_kwh * overlap_s / nullif(run_s, 0)), 0) AS energy_kwh,
                   sum(gpus * overlap_s * mean_util) / nullif(sum(gpus * overlap_s)
                       FILTER (WHERE mean_util IS NOT NULL), 0) AS mean_util,
                   count(*) FILTER (WHERE running) AS running_jobs,
                   {_ENDED_BY}, {_WHOLE}
            FROM a""",
        _params(start, end, now, cluster, co2e_per_kwh),
    ).fetchone()
    return dict(row) if row else {"jobs": 0, "gpu_hours": 0.0, "energy_kwh": 0.0, "mean_util": None,
                                  "running_jobs": 0, "timeout_gpu_hours": 0.0, "cancelled_gpu_hours": 0.0,
                                  "node_energy_kwh": None, "total_energy_kwh": None, "co2e_kg": None}


def underused_allocations(
    conn: Connection,
    start: dt.datetime,
    end: dt.datetime,
    *,
    below_percent: float,
    cluster: str | None = None,
    now: dt.datetime | None = None,
    limit: int = 500,
) -> list[dict[str, Any]]:
    """Jobs with a summary whose mean GPU utilisation is below ``below_percent``, most
    wasted GPU-hours first (running jobs have no summary yet and are not listed); ``end_reason`` says
    why jobsight ended one (a waste policy's cancellation)."""
    return conn.execute(
        f"""WITH a AS ({_allocations(cluster)})
            SELECT cluster, job_id, user_name, account, partition, name, state, end_reason, start_time, end_time,
                   gpus, gpus * overlap_s / 3600.0 AS gpu_hours, mean_util, energy_kwh, flags
            FROM a WHERE mean_util < %(below)s
            ORDER BY gpus * overlap_s * (100 - mean_util) DESC, job_id LIMIT %(limit)s""",
        {**_params(start, end, now, cluster), "below": below_percent, "limit": max(1, min(limit, 5000))},
    ).fetchall()


def daily_trend(
    conn: Connection,
    start: dt.datetime,
    end: dt.datetime,
    *,
    low_util_percent: float = 30.0,
    cluster: str | None = None,
    now: dt.datetime | None = None,
) -> list[dict[str, Any]]:
    """Per UTC day of the period: GPU-hours, GPU-hours of jobs below ``low_util_percent``, energy."""
    return conn.execute(
        f"""WITH a AS ({_allocations(cluster)}),
                 days AS (SELECT d AS day_start, d + interval '1 day' AS day_end
                          FROM generate_series(date_trunc('day', %(start)s::timestamptz AT TIME ZONE 'UTC')
                                                   AT TIME ZONE 'UTC',
                                               %(end)s::timestamptz - interval '1 microsecond',
                                               interval '1 day') d),
                 x AS (SELECT days.day_start, a.gpus, a.mean_util, a.energy_kwh, a.run_s,
                              extract(epoch FROM least(a.seg_end, days.day_end)
                                                 - greatest(a.seg_start, days.day_start)) AS s
                       FROM days JOIN a ON a.seg_start < days.day_end AND a.seg_end > days.day_start)
            SELECT days.day_start AS day,
                   coalesce(sum(x.gpus * x.s) / 3600.0, 0) AS gpu_hours,
                   coalesce(sum(x.gpus * x.s) FILTER (WHERE x.mean_util < %(low)s) / 3600.0, 0) AS low_util_gpu_hours,
                   coalesce(sum(x.energy_kwh * x.s / nullif(x.run_s, 0)), 0) AS energy_kwh
            FROM days LEFT JOIN x ON x.day_start = days.day_start
            GROUP BY days.day_start ORDER BY days.day_start""",
        {**_params(start, end, now, cluster), "low": low_util_percent},
    ).fetchall()
