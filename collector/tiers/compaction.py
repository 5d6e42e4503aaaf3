"""The compaction pass: closed days of the hot tier rewritten into the packed tier.

For each closed day (one that ended at least ``older_than`` ago) whose ``gpu_samples``,
``gpu_minutes`` or ``host_samples`` partition holds rows:

1. a trigger is put on the day's raw partitions that refuses new rows with a serialization
   failure: a late batch for that day (an outage being replayed) is answered 503 and sent again
   by its agent after the pass, while every other batch goes on (the ingest path stores a group
   that fails so batch by batch). Nothing waits on the pass, and the raw rows cannot change
   under it;
2. in one transaction, per job, the job's GPUs are added to ``gpu_devices``, then per hour its
   samples, and per day its minutes, are packed together with what that job-hour (job-day)
   already had in the packed tier (late samples that landed after an earlier pass) into
   ``gpu_sample_blocks`` + ``gpu_sample_timelines`` and ``gpu_minute_blocks``, and per day its
   host samples into ``host_sample_blocks`` (:mod:`jobsight.collector.tiers.host_tier`);
3. in the same transaction the raw partitions are truncated and the trigger dropped.
   TRUNCATE gives the disk space back at commit (new empty files, the old ones unlinked), like
   a DROP, but keeps the partitions in place, so a later late batch for the day finds its
   partition, in this process and in every other collector process whose partition cache
   (``PartitionKeeper``) still lists it. Readers see the raw rows up to the commit and the
   packed ones from it; both tiers are always read (:mod:`jobsight.collector.tiers.reads`).

Then whole partitions go: the (empty) raw partitions of days no record can reach any more (the
wire refuses records more than 7 days old), and the packed partitions past their retention, with
those of ``gpu_hours``: the hour rollup is neither refused, packed nor emptied by the pass (it is
tiny, and what long jobs' pages read), but it is kept as long as the packed minutes it sums.

One pass runs at a time across every collector process and ``jobsight compact``: the pass holds
a session-level advisory lock and a pass that cannot take it does nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from jobsight.collector.store.db import Connection
from jobsight.collector.store.partitions import PartitionKeeper, partition_name
from jobsight.collector.store.schema import PACKED_RETENTION_TABLES, PACKED_TABLES, SAMPLE_COUNTS
from jobsight.collector.tiers import host_tier
from jobsight.collector.tiers.packed_format import DEVICE_COLUMNS, ENCODINGS, ENERGY_MJ, ORDER
from jobsight.collector.tiers.reads import MINUTE_VALUES, unpack_minutes, unpack_samples

log = logging.getLogger("jobsight.collector")

COMPACTION_LOCK_KEY: Final = 0x6A6F6263
"""Session advisory lock held by the one pass that runs."""

RAW_TABLES: Final = ("gpu_samples", "gpu_minutes", "host_samples")
LATE_DAYS: Final = 8
"""Raw partitions of days more than this many days old are dropped once empty: the wire refuses
records older than 7 days, so no sample can reach them (a day of margin for clocks)."""

LOCK_TIMEOUT: Final = "60s"
"""How long a pass waits for a lock (a batch being written to the day, a long read of it)
before it gives the day up until the next pass."""

WORK_MEM: Final = "64MB"
"""Sort memory for a pass's transaction: one job-hour of 64 GPUs at 1 Hz sorts in memory."""

HOUR_ORIGIN: Final = "TIMESTAMPTZ '2000-01-01 00:00:00+00'"
"""``date_bin`` origin: UTC hours whatever the session's time zone."""


@dataclass
class DayReport:
    day: dt.date
    jobs: int = 0
    samples: int = 0
    """Samples now packed for the day's rewritten job-hours (earlier packed ones included)."""
    sample_blocks: int = 0
    minutes: int = 0
    host_samples: int = 0
    """Host samples now packed for the day's rewritten job-days."""
    raw_bytes: int = 0
    """The raw partitions' size before the pass (table, TOAST and indexes)."""


@dataclass
class PassReport:
    ran: bool
    """``False``: another pass held the lock, this one did nothing."""
    days: list[DayReport] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def _scalar(conn: Connection, query: str | sql.Composed, params: dict[str, Any] | None = None) -> Any:
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(query, params).fetchone()
    return row[0] if row else None


@contextmanager
def pass_lock(conn: Connection) -> Iterator[bool]:
    """Yields whether this session holds the compaction lock (and releases it after)."""
    got = bool(_scalar(conn, "SELECT pg_try_advisory_lock(%(key)s)", {"key": COMPACTION_LOCK_KEY}))
    try:
        yield got
    finally:
        if got:
            _scalar(conn, "SELECT pg_advisory_unlock(%(key)s)", {"key": COMPACTION_LOCK_KEY})


def run_pass(
    conn: Connection,
    keeper: PartitionKeeper,
    *,
    older_than: dt.timedelta,
    packed_retention_days: int,
    now: dt.datetime | None = None,
) -> PassReport:
    """Compact every closed day that ended ``older_than`` ago or earlier, then drop the partitions
    the tiers' rules let go. ``conn`` must be in autocommit (each day is its own transaction)."""
    now = now or dt.datetime.now(dt.UTC)
    today = now.astimezone(dt.UTC).date()
    with pass_lock(conn) as got:
        if not got:
            log.info("compaction: another pass is running; skipped")
            return PassReport(ran=False)
        _drop_refusing_triggers(conn)
        keeper.reload(conn)
        report = PassReport(ran=True)
        for day in days_to_compact(conn, keeper, now - older_than):
            report.days.append(compact_day(conn, keeper, day))
        late_limit = today - dt.timedelta(days=LATE_DAYS)
        for table in RAW_TABLES:
            for day in keeper.days(table):
                if day < late_limit and keeper.drop_if_empty(conn, table, day):
                    report.dropped.append(partition_name(table, day))
        report.dropped += keeper.drop_older_than(conn, packed_retention_days, today, tables=PACKED_RETENTION_TABLES)
    for day_report in report.days:
        log.info("compaction: %s: %d jobs, %d samples in %d blocks, %d minutes, %d host samples; "
                 "%d raw bytes freed", day_report.day, day_report.jobs, day_report.samples,
                 day_report.sample_blocks, day_report.minutes, day_report.host_samples, day_report.raw_bytes)
    return report


def days_to_compact(conn: Connection, keeper: PartitionKeeper, cutoff: dt.datetime) -> list[dt.date]:
    """Days that ended at or before ``cutoff`` and still hold raw GPU or host rows."""
    days = set()
    for table in RAW_TABLES:
        for day in keeper.days(table):
            day_end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)
            if day_end <= cutoff and day not in days and _has_rows(conn, partition_name(table, day)):
                days.add(day)
    return sorted(days)


def _has_rows(conn: Connection, partition: str) -> bool:
    # SELECT 1, never an empty select list: Citus refuses one over a distributed table.
    return bool(_scalar(conn, sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(partition))))


def compact_day(conn: Connection, keeper: PartitionKeeper, day: dt.date) -> DayReport:
    """Pack one day's raw GPU and host rows (merging them with what the day already has packed) and
    empty its raw partitions. ``conn`` must be in autocommit."""
    # Host rows are packed only where the day has a raw host partition (made ahead with the
    # others, so almost always), and only for the jobs that have rows in it once the day refuses
    # new ones (below): a row that lands before that is packed or stays for the next pass.
    hosts = keeper.exists("host_samples", day)
    for table in PACKED_TABLES:
        if hosts or table != "host_sample_blocks":
            keeper.ensure(conn, table, [day])
    raw = [sql.Identifier(partition_name(t, day)) for t in RAW_TABLES if keeper.exists(t, day)]
    report = DayReport(day)
    start = dt.datetime.combine(day, dt.time(), dt.UTC)
    span = {"day": start, "day_end": start + dt.timedelta(days=1)}
    try:
        with conn.transaction():
            # Waits for the batches being written to the day to commit, then refuses the next.
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            conn.execute(_CITUS_TRIGGERS)
            for name in raw:
                conn.execute(sql.SQL(_REFUSE_ROWS).format(sql.Identifier(REFUSING_TRIGGER), name))
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            conn.execute(f"SET LOCAL work_mem = '{WORK_MEM}'")
            conn.execute(_CITUS_TRIGGERS)
            conn.execute(_CITUS_ONE_CONNECTION)
            report.raw_bytes = sum(
                int(_scalar(conn, "SELECT pg_total_relation_size(%(name)s::regclass)",
                            {"name": partition_name(t, day)}))
                for t in RAW_TABLES if keeper.exists(t, day)
            )
            with conn.cursor(row_factory=tuple_row) as cur:
                day_jobs = _DAY_JOBS_DISTRIBUTED if _is_distributed(conn) else _DAY_JOBS
                jobs = [row[0] for row in cur.execute(day_jobs, span).fetchall()]
            report.jobs = len(jobs)
            for job in jobs:
                params = {**span, "job": job}
                conn.execute(_ADD_DEVICES, params)
                for hour in range(24):
                    hour_params = {"job": job, "hour": start + dt.timedelta(hours=hour)}
                    if not _scalar(conn, _HOUR_HAS_SAMPLES, hour_params):
                        continue
                    with conn.cursor(row_factory=tuple_row) as cur:
                        blocks, samples = cur.execute(_PACK_SAMPLES, hour_params).fetchone() or (0, 0)
                    report.sample_blocks += int(blocks)
                    report.samples += int(samples)
                report.minutes += int(_scalar(conn, _PACK_MINUTES, params) or 0)
                if hosts and _scalar(conn, host_tier.JOB_DAY_HAS_SAMPLES, params):
                    report.host_samples += int(_scalar(conn, host_tier.PACK_DAY, params) or 0)
            conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(raw)))
            for name in raw:
                conn.execute(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(REFUSING_TRIGGER), name))
    except BaseException:
        # The refusal must not outlive the pass; if the connection is gone, the next pass lifts it.
        with suppress(psycopg.Error):
            _drop_refusing_triggers(conn)
        raise
    return report


REFUSING_TRIGGER: Final = "jobsight_compacting"
"""The trigger that refuses rows for a day while it is packed (function in migration 0004)."""

_REFUSE_ROWS: Final = (
    "CREATE OR REPLACE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION jobsight_refuse_while_compacting()"
)


# On Citus the trigger goes onto the day's shards (its function is distributed by ``jobsight migrate
# --citus``: collector/store/citus.py); Citus asks for this to allow it. Elsewhere a harmless placeholder.
_CITUS_TRIGGERS: Final = "SET LOCAL citus.enable_unsafe_triggers = on"
# A day's pass writes the device dictionary (a reference table) and then reads it with the job's
# shards in one transaction: Citus allows that only over one connection per worker.
_CITUS_ONE_CONNECTION: Final = "SET LOCAL citus.multi_shard_modify_mode = 'sequential'"


def _drop_refusing_triggers(conn: Connection) -> None:
    """Drop the refusing triggers a failed or killed pass left: a day's late rows must not be
    refused longer than its pass runs."""
    with conn.cursor(row_factory=tuple_row) as cur:
        tables = [row[0] for row in cur.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname = %(name)s",
            {"name": REFUSING_TRIGGER},
        ).fetchall()]
    for table in tables:
        with conn.transaction():
            conn.execute(_CITUS_TRIGGERS)
            conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                sql.Identifier(REFUSING_TRIGGER), sql.Identifier(table)))


def _skip_scan(table: str) -> str:
    """The jobs with rows of ``table`` on the day, one index probe each (a recursive CTE)."""
    return f"""{table}_jobs AS (
    (SELECT job_id FROM {table} WHERE ts >= %(day)s AND ts < %(day_end)s ORDER BY job_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.job_id FROM {table} r WHERE r.ts >= %(day)s AND r.ts < %(day_end)s
            AND r.job_id > j.job_id ORDER BY r.job_id LIMIT 1)
    FROM {table}_jobs j WHERE j.job_id IS NOT NULL
)"""


# Jobs with raw rows on the day, found by skipping through the (job_id, ...) indexes of the raw
# tables: one index probe per job, not a scan of the day.
_DAY_JOBS: Final = f"""
WITH RECURSIVE {", ".join(_skip_scan(t) for t in RAW_TABLES)}
{" UNION ".join(f"SELECT job_id FROM {t}_jobs WHERE job_id IS NOT NULL" for t in RAW_TABLES)}
ORDER BY job_id
"""
# On Citus (no recursive CTE across shards): each worker lists its shards' jobs of the day.
_DAY_JOBS_DISTRIBUTED: Final = f"""
{" UNION ".join(f"SELECT DISTINCT job_id FROM {t} WHERE ts >= %(day)s AND ts < %(day_end)s" for t in RAW_TABLES)}
ORDER BY job_id
"""


def _is_distributed(conn: Connection) -> bool:
    """Whether the raw tables are distributed (Citus): some statements take another form there."""
    if _scalar(conn, "SELECT to_regclass('pg_dist_partition')") is None:
        return False
    return bool(_scalar(conn, "SELECT EXISTS (SELECT 1 FROM pg_dist_partition "
                              "WHERE logicalrelid = 'gpu_samples'::regclass)"))


_SAME_DEVICE: Final = " AND ".join(
    f"d.{c} = s.{c}" if c in ("gpu_uuid", "gpu_index") else f"d.{c} IS NOT DISTINCT FROM s.{c}"
    for c in DEVICE_COLUMNS
)

# The job's devices of the day that the dictionary lacks (EXCEPT takes NULLs as equal, as
# _SAME_DEVICE does; Citus plans it, where it refuses a correlated NOT EXISTS over a subquery).
_ADD_DEVICES: Final = f"""
INSERT INTO gpu_devices ({", ".join(DEVICE_COLUMNS)})
SELECT {", ".join(f"s.{c}" for c in DEVICE_COLUMNS)}
FROM (SELECT DISTINCT {", ".join(DEVICE_COLUMNS)} FROM gpu_samples
      WHERE job_id = %(job)s AND ts >= %(day)s AND ts < %(day_end)s
      EXCEPT SELECT {", ".join(DEVICE_COLUMNS)} FROM gpu_devices) s
ORDER BY {", ".join(f"s.{c}" for c in DEVICE_COLUMNS)}
"""

_HOUR_HAS_SAMPLES: Final = """
SELECT EXISTS (SELECT 1 FROM gpu_samples
               WHERE job_id = %(job)s AND ts >= %(hour)s AND ts < %(hour)s + interval '1 hour')
"""

_MEASURES: Final = tuple(ENCODINGS)
_STORED: Final = tuple(c for e in ENCODINGS.values() for c in e.stored)

# One job-hour: its raw samples and the samples its blocks already hold (deleted here and
# packed again with the new ones), packed per GPU. GPUs sampled at the same times share a
# timeline. The DELETEs run to completion before the INSERTs write (the aggregate reads all of
# its input first), and a row this transaction deleted does not count against the primary key.
_PACK_SAMPLES: Final = f"""
WITH old_blocks AS (
    DELETE FROM gpu_sample_blocks WHERE job_id = %(job)s AND ts = %(hour)s RETURNING *
), old_timelines AS (
    DELETE FROM gpu_sample_timelines WHERE job_id = %(job)s AND ts = %(hour)s RETURNING *
), src AS (
    SELECT s.cluster, s.ts, d.id AS device, {", ".join(f"s.{c}" for c in _MEASURES)}
    FROM gpu_samples s JOIN gpu_devices d ON {_SAME_DEVICE}
    WHERE s.job_id = %(job)s AND s.ts >= %(hour)s AND s.ts < %(hour)s + interval '1 hour'
    UNION ALL
    SELECT o.b_cluster, o.u_ts, o.b_device, {", ".join(f"o.{c}" for c in _MEASURES)}
    FROM {unpack_samples(_MEASURES, blocks="old_blocks", timelines="old_timelines", extra=("cluster", "device"))} o
), bounded AS (
    -- The window is sorted as the aggregates below want their rows: one sort serves both.
    SELECT s.*, min({ENERGY_MJ}) OVER g AS e_lo, max({ENERGY_MJ}) OVER g AS e_hi
    FROM src s WINDOW g AS (PARTITION BY s.cluster, s.device ORDER BY {ORDER}
                            ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
), packed AS (
    SELECT s.cluster, s.device, count(*)::int4 AS samples, min(s.ts) AS first_ts, max(s.ts) AS last_ts,
           array_agg(s.ts ORDER BY {ORDER}) AS sample_ts,
           {", ".join(f"{agg} AS {col}" for e in ENCODINGS.values() for col, agg in zip(e.stored, e.aggregates,
                                                                                         strict=True))}
    FROM bounded s GROUP BY s.cluster, s.device
), timelines AS (
    SELECT cluster, sample_ts, (row_number() OVER (PARTITION BY cluster ORDER BY min(device)))::int4 AS timeline
    FROM packed GROUP BY cluster, sample_ts
), new_timelines AS (
    INSERT INTO gpu_sample_timelines (cluster, job_id, ts, timeline, sample_ts)
    SELECT cluster, %(job)s, %(hour)s, timeline, sample_ts FROM timelines
), new_blocks AS (
    INSERT INTO gpu_sample_blocks (cluster, job_id, ts, device, timeline, samples, first_ts, last_ts,
                                   {", ".join(_STORED)})
    SELECT p.cluster, %(job)s, %(hour)s, p.device, t.timeline, p.samples, p.first_ts, p.last_ts,
           {", ".join(f"p.{c}" for c in _STORED)}
    FROM packed p JOIN timelines t ON t.cluster = p.cluster AND t.sample_ts = p.sample_ts
    RETURNING samples
)
SELECT count(*), coalesce(sum(samples), 0) FROM new_blocks
"""

MINUTE_MERGE: Final[dict[str, str]] = {
    "gpu_uuid": "min", "samples": "sum", "util_gpu_sum": "sum", "util_gpu_n": "sum", "util_gpu_max": "max",
    "util_idle_n": "sum", "util_mem_sum": "sum", "util_mem_n": "sum", "mem_used_max": "max",
    "mem_total_max": "max", "power_sum": "sum", "power_n": "sum", "temp_sum": "sum", "temp_n": "sum",
    "energy_min": "min", "energy_max": "max", "energy_n": "sum", "first_ts": "min", "last_ts": "max",
    "lost": "bool_or",
}
"""How two rollup rows of one GPU-minute combine (a packed minute and late samples' minute):
as the ingest path's upsert adds a batch to a stored row. ``gpu_uuid`` is the first stored;
min() gives what the readers' min(gpu_uuid) gave over the two rows."""

_INT_SUMS: Final = {c for c in MINUTE_VALUES if c.endswith("_n") or c == "samples"}


def _merged(column: str) -> str:
    rule = MINUTE_MERGE[column]
    return f"{rule}({column}){'::int4' if column in _INT_SUMS else ''} AS {column}"


_MINUTE_HOUR: Final = f"date_bin('1 hour', ts, {HOUR_ORIGIN})"


def _minute_array(column: str) -> str:
    if column in SAMPLE_COUNTS:  # NULL when it says "every sample" throughout the block
        return f"CASE WHEN bool_and({column} = samples) THEN NULL ELSE array_agg({column} ORDER BY ts) END"
    return f"array_agg({column} ORDER BY ts)"

# One job-day of minutes: the raw rollup rows and the packed ones (deleted here and packed
# again), merged per GPU-minute, then one array per column and GPU-hour.
_PACK_MINUTES: Final = f"""
WITH old AS (
    DELETE FROM gpu_minute_blocks WHERE job_id = %(job)s AND ts >= %(day)s AND ts < %(day_end)s RETURNING *
), src AS (
    SELECT cluster, ts, node, gpu_index, mig_uuid, {", ".join(MINUTE_VALUES)}
    FROM gpu_minutes WHERE job_id = %(job)s AND ts >= %(day)s AND ts < %(day_end)s
    UNION ALL
    SELECT cluster, ts, node, gpu_index, mig_uuid, {", ".join(MINUTE_VALUES)} FROM {unpack_minutes(blocks="old")} o
), merged AS (
    SELECT cluster, ts, node, gpu_index, mig_uuid, {", ".join(_merged(c) for c in MINUTE_VALUES)}
    FROM src GROUP BY cluster, ts, node, gpu_index, mig_uuid
), new_blocks AS (
    INSERT INTO gpu_minute_blocks (cluster, job_id, ts, node, gpu_index, mig_uuid, minute_ts,
                                   {", ".join(MINUTE_VALUES)})
    SELECT cluster, %(job)s, {_MINUTE_HOUR}, node, gpu_index, mig_uuid, array_agg(ts ORDER BY ts),
           {", ".join(_minute_array(c) for c in MINUTE_VALUES)}
    FROM merged GROUP BY cluster, {_MINUTE_HOUR}, node, gpu_index, mig_uuid
    RETURNING cardinality(minute_ts) AS minutes
)
SELECT coalesce(sum(minutes), 0) FROM new_blocks
"""
