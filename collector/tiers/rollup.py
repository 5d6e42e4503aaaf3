"""The per-minute and per-hour GPU rollups (``gpu_minutes``, ``gpu_hours``), folded into each
ingest transaction.

GPU samples are summed per (job, node, GPU, MIG device, minute) in Python when a batch is
prepared (:meth:`MinuteRollup.add_rows`, in the decode thread). The group commit merges the
rollups of every batch it writes per (cluster, key) and adds them to the stored rows with
one ``INSERT … ON CONFLICT DO UPDATE`` (:func:`upsert_minutes`); the same minute sums combined
per hour (:func:`hourly`) go to ``gpu_hours`` the same way (:func:`upsert_hours`). Sums, counts
and extremes make the result independent of how samples were split into batches and groups;
rows are written in key order, minutes then hours, so that concurrent groups lock them in the
same order (no deadlock).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import orjson
from psycopg.rows import tuple_row

from jobsight.collector.store.db import Connection
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import gpu_samples
from jobsight.collector.store.timestamps import MINUTE_US, day_of_us, ts_from_us
from jobsight.collector.tiers import reads as tiers

IDLE_UTIL = 5.0
"""Utilisation (%) under which a sample counts as idle, for summaries' idle fraction."""

Key = tuple[str, str, int, str, int]
"""job, node ('' for none), GPU index, MIG uuid ('' for none), minute (µs since the epoch)."""
ClusterKey = tuple[str, str, str, int, str, int]
"""The cluster, then a :data:`Key`: what one ``gpu_minutes`` (or ``gpu_hours``) row is keyed by."""

HOUR_US: Final = 60 * MINUTE_US
HOUR_ORIGIN: Final = "TIMESTAMPTZ '2000-01-01 00:00:00+00'"
"""``date_bin`` origin: UTC hours whatever the session's time zone (``date_trunc`` would take
the session's hours, half an hour off in some zones)."""

# Positions in a gpu_samples row (ingest_rows builds rows in the table's column order).
_AT: Final = {column.name: i for i, column in enumerate(gpu_samples.columns)}
_JOB, _NODE, _GPU, _UUID, _MIG = (_AT[n] for n in ("job_id", "node", "gpu_index", "gpu_uuid", "mig_uuid"))
_UTIL, _UTIL_MEM, _MEM_USED, _MEM_TOTAL = (_AT[n] for n in ("util_gpu", "util_mem", "mem_used", "mem_total"))
_POWER, _ENERGY, _TEMP, _LOST = (_AT[n] for n in ("power_w", "energy_j", "temp_c", "lost"))


@dataclass(slots=True)
class MinuteSums:
    gpu_uuid: str
    first_ts: int
    """µs since the epoch, like ``last_ts``; converted when written."""
    last_ts: int
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


def combined(a: MinuteSums, b: MinuteSums) -> MinuteSums:
    """A new sum of ``a`` and ``b`` (neither is changed: a batch keeps its own rollup, for
    when its group falls back to storing batch by batch)."""
    return MinuteSums(
        a.gpu_uuid, min(a.first_ts, b.first_ts), max(a.last_ts, b.last_ts), a.samples + b.samples,
        a.util_gpu_sum + b.util_gpu_sum, a.util_gpu_n + b.util_gpu_n, _max(a.util_gpu_max, b.util_gpu_max),
        a.util_idle_n + b.util_idle_n, a.util_mem_sum + b.util_mem_sum, a.util_mem_n + b.util_mem_n,
        _max(a.mem_used_max, b.mem_used_max), _max(a.mem_total_max, b.mem_total_max), a.power_sum + b.power_sum,
        a.power_n + b.power_n, a.temp_sum + b.temp_sum, a.temp_n + b.temp_n, _min(a.energy_min, b.energy_min),
        _max(a.energy_max, b.energy_max), a.energy_n + b.energy_n, a.lost or b.lost,
    )


@dataclass
class MinuteRollup:
    """Accumulates one batch's GPU samples."""

    sums: dict[Key, MinuteSums] = field(default_factory=dict)

    def add_rows(self, rows: Sequence[tuple[Any, ...]], ts_us: Sequence[int]) -> None:
        """Fold ``gpu_samples`` rows in, ``ts_us`` being their times as integers. Inline and
        on locals: this runs once per sample, and a call or attribute look-up per field would
        cost more than the arithmetic."""
        sums = self.sums
        for row, us in zip(rows, ts_us, strict=True):
            key = (row[_JOB], row[_NODE] or "", row[_GPU], row[_MIG] or "", us - us % MINUTE_US)
            s = sums.get(key)
            if s is None:
                s = sums[key] = MinuteSums(row[_UUID], us, us)
            elif us < s.first_ts:
                s.first_ts = us
            elif us > s.last_ts:
                s.last_ts = us
            s.samples += 1
            if (util := row[_UTIL]) is not None:
                s.util_gpu_sum += util
                s.util_gpu_n += 1
                if s.util_gpu_max is None or util > s.util_gpu_max:
                    s.util_gpu_max = util
                if util < IDLE_UTIL:
                    s.util_idle_n += 1
            if (util_mem := row[_UTIL_MEM]) is not None:
                s.util_mem_sum += util_mem
                s.util_mem_n += 1
            if (power := row[_POWER]) is not None:
                s.power_sum += power
                s.power_n += 1
            if (temp := row[_TEMP]) is not None:
                s.temp_sum += temp
                s.temp_n += 1
            if (mem_used := row[_MEM_USED]) is not None and (s.mem_used_max is None or mem_used > s.mem_used_max):
                s.mem_used_max = mem_used
            if (mem_total := row[_MEM_TOTAL]) is not None and (
                s.mem_total_max is None or mem_total > s.mem_total_max
            ):
                s.mem_total_max = mem_total
            if (energy := row[_ENERGY]) is not None:
                if s.energy_min is None or energy < s.energy_min:
                    s.energy_min = energy
                if s.energy_max is None or energy > s.energy_max:
                    s.energy_max = energy
                s.energy_n += 1
            if row[_LOST]:
                s.lost = True

    def days(self) -> set[dt.date]:
        return {day_of_us(key[4]) for key in self.sums}


S = TypeVar("S")


def merge_keyed(parts: Iterable[tuple[str, Mapping[tuple[Any, ...], S]]], combine: Callable[[S, S], S]) -> dict[Any, S]:
    """Several batches' sums (each with its cluster) as one set of rows keyed ``(cluster, *key)``,
    combined where batches share a key, so that one statement never proposes a row twice (which
    ``ON CONFLICT DO UPDATE`` refuses)."""
    out: dict[Any, S] = {}
    for cluster, sums_by_key in parts:
        for key, sums in sums_by_key.items():
            full = (cluster, *key)
            seen = out.get(full)
            out[full] = sums if seen is None else combine(seen, sums)
    return out


def merged(parts: Iterable[tuple[str, MinuteRollup]]) -> dict[ClusterKey, MinuteSums]:
    """The rollups of several batches (with their clusters) as one set of ``gpu_minutes`` rows."""
    return merge_keyed(((cluster, rollup.sums) for cluster, rollup in parts), combined)


def hourly(minutes: dict[ClusterKey, MinuteSums]) -> dict[ClusterKey, MinuteSums]:
    """:func:`merged` minute rows combined per UTC hour (the key's time is the hour's). In key
    order, so that an hour's ``gpu_uuid`` is its first minute's, as ``gpu_minutes`` keeps the
    first one stored, and its float sums come out the same for the same minutes."""
    out: dict[ClusterKey, MinuteSums] = {}
    for key in sorted(minutes):
        hour = (*key[:5], key[5] - key[5] % HOUR_US)
        seen = out.get(hour)
        out[hour] = minutes[key] if seen is None else combined(seen, minutes[key])
    return out


_COLUMNS = (
    "gpu_uuid", "samples", "util_gpu_sum", "util_gpu_n", "util_gpu_max", "util_idle_n", "util_mem_sum",
    "util_mem_n", "mem_used_max", "mem_total_max", "power_sum", "power_n", "temp_sum", "temp_n", "energy_min",
    "energy_max", "energy_n", "first_ts", "last_ts", "lost",
)
_TYPES = (
    "text", "int", "float8", "int", "float8", "int", "float8", "int", "int8", "int8", "float8", "int", "float8",
    "int", "float8", "float8", "int", "timestamptz", "timestamptz", "bool",
)
_KEY = ("cluster", "job_id", "node", "gpu_index", "mig_uuid", "ts")
_KEY_TYPES = ("text", "text", "text", "smallint", "text", "timestamptz")
_ADDED = ("samples", "util_gpu_sum", "util_gpu_n", "util_idle_n", "util_mem_sum", "util_mem_n", "power_sum",
          "power_n", "temp_sum", "temp_n", "energy_n")
_GREATEST = ("util_gpu_max", "mem_used_max", "mem_total_max", "energy_max", "last_ts")
_LEAST = ("energy_min", "first_ts")


def _upsert(table: str) -> str:
    """The statement adding rollup rows to ``table`` (``gpu_minutes`` or ``gpu_hours``).

    The rows go in as one JSON array (orjson writes it in C, and floats as the shortest text that
    reads back as the same double), not as 26 arrays, which psycopg dumped element by element
    in Python: that was most of the cost of a group of small batches. Rows are in key order."""
    return f"""
INSERT INTO {table} AS g ({", ".join(_KEY)}, {", ".join(_COLUMNS)})
SELECT {", ".join(_KEY)}, {", ".join(_COLUMNS)}
FROM jsonb_to_recordset(%s::jsonb) AS r(
    {", ".join(f"{c} {t}" for c, t in zip((*_KEY, *_COLUMNS), (*_KEY_TYPES, *_TYPES), strict=True))})
ON CONFLICT (job_id, cluster, node, gpu_index, mig_uuid, ts) DO UPDATE SET
    {", ".join(f"{c} = g.{c} + excluded.{c}" for c in _ADDED)},
    {", ".join(f"{c} = greatest(g.{c}, excluded.{c})" for c in _GREATEST)},
    {", ".join(f"{c} = least(g.{c}, excluded.{c})" for c in _LEAST)},
    lost = g.lost OR excluded.lost
"""


_UPSERT: Final = {table: _upsert(table) for table in ("gpu_minutes", "gpu_hours")}


def _as_json(key: ClusterKey, s: MinuteSums) -> dict[str, Any]:
    row = dict(zip(_KEY, key, strict=True))
    row["ts"] = ts_from_us(key[5])
    for column in _COLUMNS:
        row[column] = getattr(s, column)
    row["first_ts"], row["last_ts"] = ts_from_us(s.first_ts), ts_from_us(s.last_ts)
    return row


def _upsert_rows(conn: Connection, table: str, rows: dict[ClusterKey, MinuteSums]) -> None:
    if not rows:
        return
    conn.execute(_UPSERT[table], (orjson.dumps([_as_json(key, rows[key]) for key in sorted(rows)]).decode(),))


def upsert_minutes(conn: Connection, rows: dict[ClusterKey, MinuteSums]) -> None:
    """Add :func:`merged` rows to ``gpu_minutes``, in key order, in one statement."""
    _upsert_rows(conn, "gpu_minutes", rows)


def upsert_hours(conn: Connection, rows: dict[ClusterKey, MinuteSums]) -> None:
    """Add :func:`hourly` rows to ``gpu_hours``, in key order, in one statement: after
    :func:`upsert_minutes`, in its transaction."""
    _upsert_rows(conn, "gpu_hours", rows)


_REBUILD = f"""
INSERT INTO gpu_minutes (cluster, job_id, ts, node, gpu_index, mig_uuid, gpu_uuid, samples, util_gpu_sum,
                         util_gpu_n, util_gpu_max, util_idle_n, util_mem_sum, util_mem_n, mem_used_max,
                         mem_total_max, power_sum, power_n, temp_sum, temp_n, energy_min, energy_max, energy_n,
                         first_ts, last_ts, lost)
SELECT %(cluster)s, %(job)s, date_trunc('minute', ts), coalesce(node, ''), gpu_index, coalesce(mig_uuid, ''),
       min(gpu_uuid), count(*), coalesce(sum(util_gpu), 0), count(util_gpu), max(util_gpu),
       count(*) FILTER (WHERE util_gpu < %(idle)s), coalesce(sum(util_mem), 0), count(util_mem), max(mem_used),
       max(mem_total), coalesce(sum(power_w), 0), count(power_w), coalesce(sum(temp_c), 0), count(temp_c),
       min(energy_j), max(energy_j), count(energy_j), min(ts), max(ts), coalesce(bool_or(lost), false)
FROM {tiers.samples(("util_gpu", "util_mem", "mem_used", "mem_total", "power_w", "temp_c", "energy_j", "lost"))} s
GROUP BY date_trunc('minute', ts), coalesce(node, ''), gpu_index, coalesce(mig_uuid, '')
"""


def _hour_value(column: str) -> str:
    """How the minutes of an hour make the hour's ``column``: as :func:`combined` adds them
    (``gpu_uuid`` aside: the least, as the minutes' own rebuild takes it)."""
    if column in _ADDED:
        return f"sum({column})"
    if column in _GREATEST:
        return f"max({column})"
    if column == "lost":
        return "bool_or(lost)"
    return f"min({column})"  # _LEAST's, and gpu_uuid


_HOUR = f"date_bin('1 hour', ts, {HOUR_ORIGIN})"

# From the job's minutes once they are all hot (rebuild_minutes has just written them).
_REBUILD_HOURS = f"""
INSERT INTO gpu_hours (cluster, job_id, ts, node, gpu_index, mig_uuid, {", ".join(_COLUMNS)})
SELECT cluster, job_id, {_HOUR}, node, gpu_index, mig_uuid, {", ".join(_hour_value(c) for c in _COLUMNS)}
FROM gpu_minutes WHERE cluster = %(cluster)s AND job_id = %(job)s
GROUP BY cluster, job_id, {_HOUR}, node, gpu_index, mig_uuid
"""

_MINUTE_DAYS = """SELECT DISTINCT (ts AT TIME ZONE 'UTC')::date AS day FROM gpu_minutes
                  WHERE cluster = %(cluster)s AND job_id = %(job)s"""


def rebuild_minutes(conn: Connection, cluster: str, job_id: str) -> None:
    """Recompute a job's rollups (minutes and hours) from its samples (both tiers): for rows
    written around the ingest path (bulk loads, jobs stored before the rollup existed). The
    minutes go to ``gpu_minutes``, whose partitions for the job's days must exist (the hours'
    are made here); the packed minutes of the job are removed, and the next compaction pass
    packs the closed hours again."""
    params = {"cluster": cluster, "job": job_id, "idle": IDLE_UTIL}
    conn.execute("DELETE FROM gpu_minutes WHERE cluster = %(cluster)s AND job_id = %(job)s", params)
    conn.execute(_REBUILD, params)
    conn.execute("DELETE FROM gpu_minute_blocks WHERE cluster = %(cluster)s AND job_id = %(job)s", params)
    rebuild_hours(conn, cluster, job_id)


def rebuild_hours(conn: Connection, cluster: str, job_id: str) -> None:
    """Recompute a job's ``gpu_hours`` rows from its ``gpu_minutes`` rows (its packed minutes
    are not read: call this when the job has none, as after :func:`rebuild_minutes`)."""
    params = {"cluster": cluster, "job": job_id}
    with conn.cursor(row_factory=tuple_row) as cur:  # whatever rows the caller's connection makes
        days = [row[0] for row in cur.execute(_MINUTE_DAYS, params).fetchall()]
    PartitionKeeper().ensure(conn, "gpu_hours", days)
    conn.execute("DELETE FROM gpu_hours WHERE cluster = %(cluster)s AND job_id = %(job)s", params)
    conn.execute(_REBUILD_HOURS, params)
