"""A running job's energy so far, cheaply: from the hourly GPU rollup alone.

An ended job's energy is in its summary (:mod:`jobsight.collector.jobs.summaries`), computed once at
its end. A running job has none, and lists of many running jobs (the audit) cannot afford a
summary each. ``gpu_hours`` is kept up to date at ingest, hour by hour including the current one,
and is a row per GPU and hour (a 64-GPU job running a day: 1,536 rows), so reading it for every
running job of a list costs little.

Per GPU: with an energy counter (two or more readings), the greatest reading minus the least,
which is exactly what the summary will say for the time sampled so far. Without one, the mean
power over the GPU's samples times the time from its first to its last sample: the summary's
trapezoids need consecutive samples, which the rollup does not keep; with samples at an even
interval the two differ by half a sample's energy at each end (under 1 % once a GPU has a hundred
samples).
"""

from __future__ import annotations

from typing import Any, Final

from jobsight.collector.jobs.node_energy import J_PER_KWH
from jobsight.collector.store.db import Connection


def energy_kwh_sql(job: str = "%(job)s", cluster: str = "%(cluster)s", *, only_if: str = "true") -> str:
    """A parenthesised ``SELECT`` of one row, ``energy_kwh`` (``NULL`` when no GPU of the job has a
    counter or power): the energy so far of the job named by ``job`` and ``cluster`` (SQL: named
    parameters, or an outer query's columns, for a ``LATERAL`` join). ``only_if`` (SQL on the
    outer query's columns) skips the read where false: PostgreSQL tests it once per outer row
    before reading the rollup, where a join's ``ON`` would read it and then drop the row."""
    return f"""(
    SELECT sum(CASE WHEN energy_n >= 2 THEN energy_max - energy_min ELSE power_mean * span_s END)
           / {J_PER_KWH} AS energy_kwh
    FROM (SELECT sum(energy_n) AS energy_n, max(energy_max) AS energy_max, min(energy_min) AS energy_min,
                 sum(power_sum) / nullif(sum(power_n), 0) AS power_mean,
                 extract(epoch FROM max(last_ts) - min(first_ts)) AS span_s
          FROM gpu_hours h WHERE h.job_id = {job} AND h.cluster = {cluster} AND ({only_if})
          GROUP BY h.node, h.gpu_index, h.mig_uuid) per_gpu
)"""


_ENERGY_SO_FAR: Final = f"SELECT energy_kwh FROM {energy_kwh_sql()} e"


def energy_so_far_kwh(conn: Connection, cluster: str, job_id: str) -> float | None:
    """The job's energy so far in kWh (see the module's docstring); ``None``: no GPU figure yet."""
    row: dict[str, Any] | None = conn.execute(_ENERGY_SO_FAR, {"job": job_id, "cluster": cluster}).fetchone()
    return None if row is None or row["energy_kwh"] is None else float(row["energy_kwh"])
