"""The per-minute GPU rollup (``gpu_minutes``), folded into each batch's transaction.

A batch's GPU samples are summed per (job, node, GPU, MIG device, minute) in Python,
then added to the stored rows with one ``INSERT … ON CONFLICT DO UPDATE``. Sums and
counts make the result independent of how samples were split into batches; rows are
written in key order so that concurrent batches lock them in the same order.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from jobsight.collector.db import Connection

IDLE_UTIL = 5.0
"""Utilisation (%) under which a sample counts as idle, for summaries' idle fraction."""

Key = tuple[str, str, int, str, dt.datetime]  # job, node, gpu index, MIG uuid, minute


@dataclass
class MinuteSums:
    gpu_uuid: str
    first_ts: dt.datetime
    last_ts: dt.datetime
    samples: int = 0
    util_gpu_sum: float = 0.0
    util_gpu_n: int = 0
    util_gpu_max: float | None = None
    util_idle_n: int = 0
    util_mem_sum: float = 0.0
    util_mem_n: int = 0
    mem_used_max: int | None = None
    mem_total_max: int | None = None
    power_sum: float = 0.0
    power_n: int = 0
    temp_sum: float = 0.0
    temp_n: int = 0
    energy_min: float | None = None
    energy_max: float | None = None
    energy_n: int = 0
    lost: bool = False


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


@dataclass
class MinuteRollup:
    """Accumulates one batch's GPU samples."""

    sums: dict[Key, MinuteSums] = field(default_factory=dict)

    def add(self, record: dict[str, Any], ts: dt.datetime) -> None:
        key = (record["job"], record.get("node") or "", record["gpu_index"], record.get("mig_uuid") or "",
               ts.replace(second=0, microsecond=0))
        row = self.sums.get(key)
        if row is None:
            row = self.sums[key] = MinuteSums(record["gpu_uuid"], ts, ts)
        row.samples += 1
        row.first_ts, row.last_ts = min(row.first_ts, ts), max(row.last_ts, ts)
        util = record.get("util_gpu")
        if util is not None:
            row.util_gpu_sum += util
            row.util_gpu_n += 1
            row.util_gpu_max = _max(row.util_gpu_max, util)
            if util < IDLE_UTIL:
                row.util_idle_n += 1
        if (util_mem := record.get("util_mem")) is not None:
            row.util_mem_sum += util_mem
            row.util_mem_n += 1
        if (power := record.get("power_w")) is not None:
            row.power_sum += power
            row.power_n += 1
        if (temp := record.get("temp_c")) is not None:
            row.temp_sum += temp
            row.temp_n += 1
        row.mem_used_max = _max(row.mem_used_max, record.get("mem_used"))
        row.mem_total_max = _max(row.mem_total_max, record.get("mem_total"))
        if (energy := record.get("energy_j")) is not None:
            row.energy_min, row.energy_max = _min(row.energy_min, energy), _max(row.energy_max, energy)
            row.energy_n += 1
        row.lost = row.lost or bool(record.get("lost"))

    def days(self) -> set[dt.date]:
        return {key[4].date() for key in self.sums}


_COLUMNS = (
    "gpu_uuid", "samples", "util_gpu_sum", "util_gpu_n", "util_gpu_max", "util_idle_n", "util_mem_sum",
    "util_mem_n", "mem_used_max", "mem_total_max", "power_sum", "power_n", "temp_sum", "temp_n", "energy_min",
    "energy_max", "energy_n", "first_ts", "last_ts", "lost",
)
_TYPES = (
    "text", "int", "float8", "int", "float8", "int", "float8", "int", "int8", "int8", "float8", "int", "float8",
    "int", "float8", "float8", "int", "timestamptz", "timestamptz", "bool",
)
_ADDED = ("samples", "util_gpu_sum", "util_gpu_n", "util_idle_n", "util_mem_sum", "util_mem_n", "power_sum",
          "power_n", "temp_sum", "temp_n", "energy_n")
_GREATEST = ("util_gpu_max", "mem_used_max", "mem_total_max", "energy_max", "last_ts")
_LEAST = ("energy_min", "first_ts")

_UPSERT = f"""
INSERT INTO gpu_minutes AS g (cluster, job_id, node, gpu_index, mig_uuid, ts, {", ".join(_COLUMNS)})
SELECT %(cluster)s, * FROM unnest(
    %(job)s::text[], %(node)s::text[], %(gpu_index)s::smallint[], %(mig_uuid)s::text[], %(ts)s::timestamptz[],
    {", ".join(f"%({c})s::{t}[]" for c, t in zip(_COLUMNS, _TYPES, strict=True))})
ON CONFLICT (job_id, cluster, node, gpu_index, mig_uuid, ts) DO UPDATE SET
    {", ".join(f"{c} = g.{c} + excluded.{c}" for c in _ADDED)},
    {", ".join(f"{c} = greatest(g.{c}, excluded.{c})" for c in _GREATEST)},
    {", ".join(f"{c} = least(g.{c}, excluded.{c})" for c in _LEAST)},
    lost = g.lost OR excluded.lost
"""


def upsert_minutes(conn: Connection, cluster: str, rollup: MinuteRollup) -> None:
    if not rollup.sums:
        return
    keys = sorted(rollup.sums)
    params: dict[str, Any] = {
        "cluster": cluster,
        "job": [k[0] for k in keys],
        "node": [k[1] for k in keys],
        "gpu_index": [k[2] for k in keys],
        "mig_uuid": [k[3] for k in keys],
        "ts": [k[4] for k in keys],
    }
    for column in _COLUMNS:
        params[column] = [getattr(rollup.sums[k], column) for k in keys]
    conn.execute(_UPSERT, params)


_REBUILD = """
INSERT INTO gpu_minutes (cluster, job_id, ts, node, gpu_index, mig_uuid, gpu_uuid, samples, util_gpu_sum,
                         util_gpu_n, util_gpu_max, util_idle_n, util_mem_sum, util_mem_n, mem_used_max,
                         mem_total_max, power_sum, power_n, temp_sum, temp_n, energy_min, energy_max, energy_n,
                         first_ts, last_ts, lost)
SELECT cluster, job_id, date_trunc('minute', ts), coalesce(node, ''), gpu_index, coalesce(mig_uuid, ''),
       min(gpu_uuid), count(*), coalesce(sum(util_gpu), 0), count(util_gpu), max(util_gpu),
       count(*) FILTER (WHERE util_gpu < %(idle)s), coalesce(sum(util_mem), 0), count(util_mem), max(mem_used),
       max(mem_total), coalesce(sum(power_w), 0), count(power_w), coalesce(sum(temp_c), 0), count(temp_c),
       min(energy_j), max(energy_j), count(energy_j), min(ts), max(ts), coalesce(bool_or(lost), false)
FROM gpu_samples
WHERE cluster = %(cluster)s AND job_id = %(job)s
GROUP BY cluster, job_id, date_trunc('minute', ts), coalesce(node, ''), gpu_index, coalesce(mig_uuid, '')
"""


def rebuild_minutes(conn: Connection, cluster: str, job_id: str) -> None:
    """Recompute a job's rollup from its samples: for rows written around the ingest path
    (bulk loads, jobs stored before the rollup existed). The partitions of ``gpu_minutes``
    for the job's days must exist."""
    params = {"cluster": cluster, "job": job_id, "idle": IDLE_UTIL}
    conn.execute("DELETE FROM gpu_minutes WHERE cluster = %(cluster)s AND job_id = %(job)s", params)
    conn.execute(_REBUILD, params)
