"""Per-job summaries: computed when a job ends, kept in ``job_summaries``.

A job's summary is computed in the ingest transaction of its ``job_ended`` (:func:`refresh_ended`;
reconciliation does the same for a job whose epilog was never heard), so the job's page shows it at once.
Rows that arrive after that (a node daemon's last batch, a spool replayed after a collector outage) do
not recompute it in their batch's transaction, which cost a whole summary per batch (0.25 s for a job of
400k steps): :func:`mark_stale` only marks the summary (``summary.refresh_due``, the time of the first
late batch since the last refresh), and the refresh pass (collector/passes/summary_refresh.py) recomputes
marked summaries (:func:`refresh_marked`) at most once per ``summary_refresh_interval_s``. A running
job costs one primary-key lookup per batch, as before.

Why the mark is an update of the summary row by every late batch, not only by the first: the pass clears
the mark before it reads the job's rows, and a batch that found the mark already set, but had not yet
committed when the pass read, would be in no summary and under no mark. Writing the row makes the
pass's clear wait for every batch that marked before it; the summary upsert keeps a mark made after
the clear (:data:`_KEEP_MARK`). Only late batches of ended jobs pay this one row write.

What a summary holds (``summary`` JSON; the headline numbers are also columns, for the
audit lists):

* per GPU (node, index, MIG device): samples, mean and max utilisation, peak memory
  and its share of the total, energy in kWh, idle fraction (samples under
  :data:`IDLE_UTIL` % utilisation), and flags;
* energy: the GPU's energy counter (last minus first ``energy_j``) when two or more
  samples carry it, else the trapezoidal integral of ``power_w`` over time;
* job: GPU count (allocated GPUs, or sampled ones if more), elapsed time (job start to
  end, else the sampled span), GPU-hours, mean utilisation (mean of the GPUs' means),
  energy, steps per second and time to first step (from the lowest rank's training
  steps; ``None`` when the job logged no steps);
* a requeued job (collector/jobs/job_runs.py): the figures above are its latest run's (``run``,
  samples and steps from ``run_start`` on), ``runs`` lists the earlier ones, and ``gpu_hours``
  adds every run's (``run_gpu_hours``: the latest run's alone);
* per GPU, ``faults`` when it counted errors in the job (collector/jobs/gpu_faults.py: NVLink, PCIe
  and ECC counters' rise, memory flags, lost); flag ``gpu_faults``;
* node energy (collector/jobs/node_energy.py): the job's share of its nodes' power beside the
  GPUs, as the node daemons split it, with the sources and splits; ``total_energy_kwh`` is the
  GPUs' and the nodes'. Emissions are not here: the emissions pass (collector/passes/emissions.py)
  adds them (``co2e_kg``, ``emissions``) once the summary is stored, and again after each refresh;
* flags: ``idle_gpu`` (a GPU whose mean utilisation is under :data:`IDLE_UTIL` %),
  ``low_utilization`` (job mean under :data:`LOW_UTIL` %), ``memory_mostly_unused``
  (every GPU's peak memory under :data:`LOW_MEMORY_SHARE` of its total).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from psycopg.types.json import Jsonb

from jobsight.collector.jobs import job_runs
from jobsight.collector.jobs.gpu_faults import gpu_faults
from jobsight.collector.jobs.node_energy import J_PER_KWH, node_energy
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import reads as tiers
from jobsight.collector.tiers.rollup import IDLE_UTIL as ROLLUP_IDLE_UTIL

IDLE_UTIL: Final = ROLLUP_IDLE_UTIL
LOW_UTIL: Final = 30.0
LOW_MEMORY_SHARE: Final = 0.25
SUMMARY_VERSION: Final = 1

# Samples and minutes come from both storage tiers (collector/tiers/reads.py).
def _gpu_sql(start: str | None) -> str:
    return _GPU_SQL_TEMPLATE.replace(
        "{samples}", tiers.samples(("util_gpu", "mem_used", "mem_total", "power_w", "energy_j"), start=start))


_GPU_SQL_TEMPLATE: Final = """
WITH s AS (
    SELECT node, gpu_index, gpu_uuid, mig_uuid, ts, util_gpu, mem_used, mem_total, power_w, energy_j,
           extract(epoch FROM ts - lag(ts) OVER w) AS dt_s, lag(power_w) OVER w AS prev_power_w
    FROM {samples} g
    -- power_w breaks ties: two samples of one GPU at one time (a tick sent twice) must be
    -- integrated in one order, whichever tier or page of the heap they are read from.
    WINDOW w AS (PARTITION BY node, gpu_index, mig_uuid ORDER BY ts, power_w)
)
SELECT node, gpu_index, mig_uuid, min(gpu_uuid) AS gpu_uuid, count(*) AS samples,
       avg(util_gpu) AS mean_util, max(util_gpu) AS max_util,
       max(mem_used) AS peak_mem, max(mem_total) AS mem_total,
       count(energy_j) AS energy_samples, max(energy_j) - min(energy_j) AS energy_counter_j,
       sum(dt_s * (power_w + prev_power_w) / 2) AS power_integral_j,
       avg(CASE WHEN util_gpu IS NULL THEN NULL WHEN util_gpu < %(idle)s THEN 1.0 ELSE 0.0 END) AS idle_fraction,
       min(ts) AS first_ts, max(ts) AS last_ts
FROM s
GROUP BY node, gpu_index, mig_uuid
ORDER BY node NULLS FIRST, gpu_index, mig_uuid NULLS FIRST
"""
_GPU_SQL: Final = _gpu_sql(None)
# A requeued job's latest run (collector/jobs/job_runs.py): its samples only, from the samples themselves,
# since the minute rollup's first minute of the run may hold the end of the run before.
_GPU_RUN_SQL: Final = _gpu_sql("%(run_start)s")

# The same per-GPU figures from the per-minute rollup: exact for counts, sums, extremes,
# the energy counter and first/last sample. Only the power integral (for GPUs without an
# energy counter, pre-Volta) needs consecutive samples; it comes from _POWER_SQL.
_GPU_MINUTES_SQL: Final = f"""
SELECT nullif(node, '') AS node, gpu_index, nullif(mig_uuid, '') AS mig_uuid, min(gpu_uuid) AS gpu_uuid,
       sum(samples) AS samples,
       sum(util_gpu_sum) / nullif(sum(util_gpu_n), 0) AS mean_util, max(util_gpu_max) AS max_util,
       max(mem_used_max) AS peak_mem, max(mem_total_max) AS mem_total,
       sum(energy_n) AS energy_samples, max(energy_max) - min(energy_min) AS energy_counter_j,
       NULL::float8 AS power_integral_j,
       sum(util_idle_n)::float8 / nullif(sum(util_gpu_n), 0) AS idle_fraction,
       min(first_ts) AS first_ts, max(last_ts) AS last_ts
FROM {tiers.minutes()} m
GROUP BY node, gpu_index, mig_uuid
ORDER BY node NULLS FIRST, gpu_index, mig_uuid NULLS FIRST
"""

_POWER_SQL: Final = f"""
WITH s AS (
    SELECT node, gpu_index, mig_uuid, power_w,
           extract(epoch FROM ts - lag(ts) OVER w) AS dt_s, lag(power_w) OVER w AS prev_power_w
    FROM {tiers.samples(("power_w",))} g
    WHERE gpu_index = ANY(%(gpus)s)
    -- power_w breaks ties: two samples of one GPU at one time (a tick sent twice) must be
    -- integrated in one order, whichever tier or page of the heap they are read from.
    WINDOW w AS (PARTITION BY node, gpu_index, mig_uuid ORDER BY ts, power_w)
)
SELECT node, gpu_index, mig_uuid, sum(dt_s * (power_w + prev_power_w) / 2) AS power_integral_j
FROM s GROUP BY node, gpu_index, mig_uuid
"""

_STEPS_SQL: Final = """
SELECT rank, count(*) AS steps, min(ts) AS first_ts, max(ts) AS last_ts,
       (array_agg(duration_s ORDER BY ts))[1] AS first_duration_s, avg(duration_s) AS mean_step_s
FROM steps
WHERE cluster = %(cluster)s AND job_id = %(job)s AND coalesce(phase, 'train') = 'train'
  AND (%(run_start)s::timestamptz IS NULL OR ts >= %(run_start)s)  -- the latest run's steps only
GROUP BY rank
ORDER BY rank NULLS FIRST
LIMIT 1
"""


def _seconds(delta: dt.timedelta) -> float:
    return delta.total_seconds()


def _gpu_summary(row: dict[str, Any]) -> dict[str, Any]:
    if row["energy_samples"] >= 2 and row["energy_counter_j"] is not None:
        energy_j, source = float(row["energy_counter_j"]), "counter"
    elif row["power_integral_j"] is not None:
        energy_j, source = float(row["power_integral_j"]), "power"
    else:
        energy_j, source = None, None
    mem_share = (
        row["peak_mem"] / row["mem_total"] if row["peak_mem"] is not None and row["mem_total"] else None
    )
    flags = []
    if row["mean_util"] is not None and row["mean_util"] < IDLE_UTIL:
        flags.append("idle_gpu")
    elif row["mean_util"] is not None and row["mean_util"] < LOW_UTIL:
        flags.append("low_utilization")
    if mem_share is not None and mem_share < LOW_MEMORY_SHARE:
        flags.append("memory_mostly_unused")
    return {
        "node": row["node"],
        "gpu_index": row["gpu_index"],
        "gpu_uuid": row["gpu_uuid"],
        "mig_uuid": row["mig_uuid"],
        "samples": row["samples"],
        "first": row["first_ts"].isoformat(),
        "last": row["last_ts"].isoformat(),
        "mean_util": row["mean_util"],
        "max_util": row["max_util"],
        "peak_mem_bytes": row["peak_mem"],
        "mem_total_bytes": row["mem_total"],
        "peak_mem_share": mem_share,
        "energy_kwh": energy_j / J_PER_KWH if energy_j is not None else None,
        "energy_source": source,
        "idle_fraction": float(row["idle_fraction"]) if row["idle_fraction"] is not None else None,
        "flags": flags,
    }


def _gpu_rows(conn: Connection, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-GPU figures from the rollup, or from the samples for a job stored without one (or for
    a requeued job's latest run)."""
    if params["run_start"] is not None:
        return conn.execute(_GPU_RUN_SQL, params).fetchall()
    rows = conn.execute(_GPU_MINUTES_SQL, params).fetchall()
    if not rows:
        return conn.execute(_GPU_SQL, params).fetchall()
    without_counter = [r for r in rows if r["energy_samples"] < 2]
    if without_counter:
        gpus = sorted({r["gpu_index"] for r in without_counter})
        integrals = {
            (r["node"], r["gpu_index"], r["mig_uuid"]): r["power_integral_j"]
            for r in conn.execute(_POWER_SQL, {**params, "gpus": gpus}).fetchall()
        }
        for row in without_counter:
            row["power_integral_j"] = integrals.get((row["node"], row["gpu_index"], row["mig_uuid"]))
    return rows


def compute_summary(conn: Connection, cluster: str, job_id: str) -> dict[str, Any] | None:
    """The summary of one job from its stored rows; ``None`` when the collector does not know the job."""
    job = conn.execute(
        "SELECT start_time, end_time, gpus, run, run_start FROM jobs WHERE cluster = %s AND job_id = %s",
        (cluster, job_id),
    ).fetchone()
    if job is None:
        return None
    # A requeued job: this summary is its latest run's, GPU-hours count every run (collector/jobs/job_runs.py).
    run_start = job["run_start"] if job["run"] > 0 else None
    params = {"cluster": cluster, "job": job_id, "idle": IDLE_UTIL, "run_start": run_start}
    gpus = [_gpu_summary(row) for row in _gpu_rows(conn, params)]
    steps = conn.execute(_STEPS_SQL, params).fetchone()

    first_sample = min((dt.datetime.fromisoformat(g["first"]) for g in gpus), default=None)
    last_sample = max((dt.datetime.fromisoformat(g["last"]) for g in gpus), default=None)
    if first_sample is not None and last_sample is not None:
        faults = gpu_faults(conn, cluster, job_id, run_start or first_sample, last_sample)
        for g in gpus:
            if not g["mig_uuid"] and (found := faults.get((g["node"], g["gpu_index"]))):
                g["faults"] = found
    start = run_start or job["start_time"] or first_sample
    end = job["end_time"] or last_sample
    elapsed_s = max(_seconds(end - start), 0.0) if start is not None and end is not None else None
    earlier = job_runs.earlier_runs(conn, cluster, job_id) if run_start is not None else []
    all_runs_s = elapsed_s + job_runs.earlier_runs_s(earlier, run_start) if elapsed_s is not None else None
    gpu_count = max(len(job["gpus"] or []), len(gpus))
    means = [g["mean_util"] for g in gpus if g["mean_util"] is not None]
    mean_util = sum(means) / len(means) if means else None
    energies = [g["energy_kwh"] for g in gpus if g["energy_kwh"] is not None]
    energy_kwh = sum(energies) if energies else None
    node = node_energy(conn, cluster, job_id, run_start)
    parts = [e for e in (energy_kwh, node["energy_kwh"]) if e is not None]

    step_summary: dict[str, Any] | None = None
    if steps is not None:
        first_duration = steps["first_duration_s"] or 0.0
        # A step's ts is when it ended: the n steps ran from (first end - first duration) to the last end.
        span_s = _seconds(steps["last_ts"] - steps["first_ts"]) + first_duration
        step_summary = {
            "rank": steps["rank"],
            "count": steps["steps"],
            "steps_per_s": steps["steps"] / span_s if span_s > 0 else None,
            "mean_step_s": steps["mean_step_s"],
            "time_to_first_step_s": _seconds(steps["first_ts"] - start) if start is not None else None,
        }

    flags: list[str] = []
    if any("idle_gpu" in g["flags"] for g in gpus):
        flags.append("idle_gpu")
    if mean_util is not None and mean_util < LOW_UTIL:
        flags.append("low_utilization")
    shares = [g["peak_mem_share"] for g in gpus if g["peak_mem_share"] is not None]
    if shares and max(shares) < LOW_MEMORY_SHARE:
        flags.append("memory_mostly_unused")
    if any("faults" in g for g in gpus):
        flags.append("gpu_faults")
    return {
        "version": SUMMARY_VERSION,
        "run": job["run"],
        "runs": [_run_summary(r) for r in earlier],
        "start": start.isoformat() if start is not None else None,
        "end": end.isoformat() if end is not None else None,
        "elapsed_s": elapsed_s,
        "gpu_count": gpu_count,
        # Every run held its GPUs: a requeued job's GPU-hours add the earlier runs' (``run_gpu_hours``: this run's).
        "gpu_hours": gpu_count * all_runs_s / 3600 if all_runs_s is not None else None,
        "run_gpu_hours": gpu_count * elapsed_s / 3600 if elapsed_s is not None else None,
        "mean_util": mean_util,
        "energy_kwh": energy_kwh,
        "node_energy_kwh": node["energy_kwh"],
        "node_energy": node,
        "total_energy_kwh": sum(parts) if parts else None,
        "gpus": gpus,
        "steps": step_summary,
        "flags": flags,
        "thresholds": {"idle_util": IDLE_UTIL, "low_util": LOW_UTIL, "low_memory_share": LOW_MEMORY_SHARE},
    }


def _run_summary(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": run["run"],
        "start": run["start_time"].isoformat() if run["start_time"] is not None else None,
        "end": run["end_time"].isoformat() if run["end_time"] is not None else None,
        "state": run["state"],
        "exit_code": run["exit_code"],
    }


def store_summary(conn: Connection, cluster: str, job_id: str) -> dict[str, Any] | None:
    """Compute and upsert one job's summary; returns it (``None``: unknown job)."""
    summary = compute_summary(conn, cluster, job_id)
    if summary is None:
        return None
    conn.execute(
        """INSERT INTO job_summaries (cluster, job_id, computed_at, gpu_count, gpu_hours, mean_util,
               energy_kwh, flags, summary, node_energy_kwh, co2e_kg)
           VALUES (%s, %s, now(), %s, %s, %s, %s, %s, %s, %s, NULL)
           ON CONFLICT (cluster, job_id) DO UPDATE SET computed_at = excluded.computed_at,
               gpu_count = excluded.gpu_count, gpu_hours = excluded.gpu_hours, mean_util = excluded.mean_util,
               energy_kwh = excluded.energy_kwh, flags = excluded.flags,
               node_energy_kwh = excluded.node_energy_kwh, co2e_kg = NULL,
               summary = """ + _KEEP_MARK,
        (
            cluster,
            job_id,
            summary["gpu_count"],
            summary["gpu_hours"],
            summary["mean_util"],
            summary["energy_kwh"],
            summary["flags"],
            Jsonb(summary),
            summary["node_energy_kwh"],
        ),
    )
    return summary


def refresh_ended(conn: Connection, cluster: str, job_ids: list[str]) -> int:
    """Recompute the summaries of those of ``job_ids`` that have ended; returns how many."""
    if not job_ids:
        return 0
    ended = conn.execute(
        "SELECT job_id FROM jobs WHERE cluster = %s AND job_id = ANY(%s) AND end_time IS NOT NULL ORDER BY job_id",
        (cluster, sorted(job_ids)),
    ).fetchall()
    for row in ended:
        store_summary(conn, cluster, row["job_id"])
    return len(ended)


REFRESH_MARK: Final = "refresh_due"
"""The key of ``job_summaries.summary`` that says rows came after the summary was computed: the time
of the first such batch (ISO 8601). Absent: the summary counts every row stored before it was computed."""

# The upsert of a summary keeps a mark made while it was computed (see the module's docstring). Only
# IMMUTABLE functions (jsonb_set, ?, ->): Citus refuses others in an upsert's DO UPDATE of a distributed table.
_KEEP_MARK: Final = f"""CASE WHEN job_summaries.summary ? '{REFRESH_MARK}'
                   THEN jsonb_set(excluded.summary, '{{{REFRESH_MARK}}}', job_summaries.summary -> '{REFRESH_MARK}')
                   ELSE excluded.summary END"""

# Only summaries of jobs that have ended (a requeued job's next run is running: its summary is recomputed
# when that run ends). Usually none: a running job costs one primary-key lookup per batch, as before.
_STORED_ENDED_SQL: Final = """
SELECT s.job_id FROM job_summaries AS s JOIN jobs AS j USING (cluster, job_id)
WHERE s.cluster = %(cluster)s AND s.job_id = ANY(%(jobs)s) AND j.end_time IS NOT NULL
ORDER BY s.job_id
"""
_MARK_SQL: Final = f"""
UPDATE job_summaries
SET summary = summary || jsonb_build_object('{REFRESH_MARK}', coalesce(summary -> '{REFRESH_MARK}', to_jsonb(now())))
WHERE cluster = %(cluster)s AND job_id = %(job)s
"""


def mark_stale(conn: Connection, cluster: str, job_ids: list[str]) -> int:
    """Mark the stored summaries of those of ``job_ids`` that have ended as missing rows just written
    (inside the caller's transaction), for the refresh pass; returns how many were marked."""
    if not job_ids:
        return 0
    stored = conn.execute(_STORED_ENDED_SQL, {"cluster": cluster, "jobs": sorted(job_ids)}).fetchall()
    for row in stored:  # in job id order, as every group locks rows
        conn.execute(_MARK_SQL, {"cluster": cluster, "job": row["job_id"]})
    return len(stored)


_MARKED_SQL: Final = f"""
SELECT s.cluster, s.job_id FROM job_summaries AS s JOIN jobs AS j USING (cluster, job_id)
WHERE s.summary ? '{REFRESH_MARK}' AND j.end_time IS NOT NULL
ORDER BY s.summary ->> '{REFRESH_MARK}', s.cluster, s.job_id
LIMIT %(limit)s
"""
_CLEAR_SQL: Final = f"""
UPDATE job_summaries SET summary = summary - '{REFRESH_MARK}'
WHERE cluster = %(cluster)s AND job_id = %(job)s AND summary ? '{REFRESH_MARK}'
"""


def refresh_marked(conn: Connection, limit: int) -> int:
    """Recompute up to ``limit`` marked summaries of ended jobs, oldest mark first; returns how many.
    ``conn`` is in autocommit mode: each job's mark is cleared in a transaction of its own, which
    waits for the batches that marked it, before its rows are read (see the module's docstring)."""
    marked = conn.execute(_MARKED_SQL, {"limit": limit}).fetchall()
    for row in marked:
        with conn.transaction():
            conn.execute(_CLEAR_SQL, {"cluster": row["cluster"], "job": row["job_id"]})
        with conn.transaction():
            store_summary(conn, row["cluster"], row["job_id"])
    return len(marked)


def get_summary(conn: Connection, cluster: str, job_id: str) -> dict[str, Any] | None:
    """The stored summary row (``None``: none computed yet, e.g. the job is still running)."""
    return conn.execute(
        """SELECT cluster, job_id, computed_at, gpu_count, gpu_hours, mean_util, energy_kwh, flags, summary,
                  node_energy_kwh, co2e_kg
           FROM job_summaries WHERE cluster = %s AND job_id = %s""",
        (cluster, job_id),
    ).fetchone()
