"""The compaction pass: closed hours of the hot tier rewritten into the packed tier.

An hour is packed once it ended at least ``older_than`` ago (``JOBSIGHT_HOT_MINUTES``, 15 min by
default): the raw tier holds the newest minutes, not days. The raw tables stay partitioned by day;
per day whose partitions hold rows of packable hours, the pass packs the span from the day's start
to ``until`` (the day's end, or the end of its last packable hour for the day still running):

1. a trigger is put on the day's raw partitions that refuses new rows *of the span* (``ts <
   until``) with a serialization failure: a late batch for those hours (an outage being replayed)
   is answered 503 and sent again by its agent after the pass, while every other batch, the
   current hour's among them, goes on (the ingest path stores a group that fails so batch by
   batch). Nothing waits on the pass, and the span's raw rows cannot change under it;
2. in one transaction, per job with rows in the span, the job's GPUs are added to
   ``gpu_devices``, then per hour that has raw rows its samples, minutes and host samples are
   packed together with what that job-hour already had in the packed tier (late samples that
   landed after an earlier pass) into ``gpu_sample_blocks`` + ``gpu_sample_timelines``,
   ``gpu_minute_blocks`` and ``host_sample_blocks`` (:mod:`jobsight.collector.tiers.host_tier`).
   Blocks are per hour: packing an hour rewrites that hour's blocks and nothing else of its day;
3. in the same transaction the packed raw rows go: a day that is over is emptied with TRUNCATE
   (the disk space back at commit, the partition kept, so a later late batch for the day finds
   it, in this process and in every other whose ``PartitionKeeper`` still lists it); the day
   still running has the span's rows deleted (its job-hours, through the job's index), and
   autovacuum makes their space the next hours' rows. Readers see the raw rows up to the commit
   and the packed ones from it; both tiers are always read (:mod:`jobsight.collector.tiers.reads`).
   The refusal is lifted after the commit (or by the next pass, if a long read keeps the lock).

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
from jobsight.collector.store.packed_params import BLOCK_INTERVAL, DEVICE_COLUMNS
from jobsight.collector.store.partitions import PartitionKeeper, partition_name
from jobsight.collector.store.schema import PACKED_RETENTION_TABLES, PACKED_TABLES, SAMPLE_COUNTS
from jobsight.collector.tiers import host_tier
from jobsight.collector.tiers.packed_format import (
    ENCODINGS,
    ORDER,
    pack_aggregates,
    pack_columns,
    pack_integers,
    pack_window,
)
from jobsight.collector.tiers.reads import MINUTE_VALUES, unpack_minutes, unpack_samples
from jobsight.collector.tiers.time_planes import offsets, packed_times

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
    until: dt.datetime
    """The end of the packed span: the day's end, or the end of its last closed hour."""
    jobs: int = 0
    samples: int = 0
    """Samples now packed for the day's rewritten job-hours (earlier packed ones included)."""
    sample_blocks: int = 0
    minutes: int = 0
    host_samples: int = 0
    """Host samples now packed for the day's rewritten job-days."""
    raw_bytes: int = 0
    """A day that is over: its raw partitions' size before the pass (table, TOAST and indexes)."""
    raw_rows: int = 0
    """A day still running: the raw rows of its packed hours deleted."""

    @property
    def whole(self) -> bool:
        """Whether the whole day was packed (and its raw partitions emptied)."""
        return self.until >= day_start(self.day) + dt.timedelta(days=1)


@dataclass
class PassReport:
    ran: bool
    """``False``: another pass held the lock, this one did nothing."""
    days: list[DayReport] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    unallocated_deleted: int = 0
    """Rows of ``gpu_unallocated_uses`` past the packed tier's retention, deleted."""


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


def day_start(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), dt.UTC)


def hour_floor(moment: dt.datetime) -> dt.datetime:
    """The start of the UTC hour ``moment`` is in."""
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def run_pass(
    conn: Connection,
    keeper: PartitionKeeper,
    *,
    older_than: dt.timedelta,
    packed_retention_days: int,
    now: dt.datetime | None = None,
) -> PassReport:
    """Compact every hour that ended ``older_than`` ago or earlier, then drop the partitions the
    tiers' rules let go. ``conn`` must be in autocommit (each day's span is its own transaction)."""
    now = now or dt.datetime.now(dt.UTC)
    today = now.astimezone(dt.UTC).date()
    pack_end = hour_floor(now - older_than)
    with pass_lock(conn) as got:
        if not got:
            log.info("compaction: another pass is running; skipped")
            return PassReport(ran=False)
        _drop_refusing_triggers(conn)
        keeper.reload(conn)
        report = PassReport(ran=True)
        for day, until in spans_to_compact(conn, keeper, pack_end):
            report.days.append(compact_day(conn, keeper, day, until))
        late_limit = today - dt.timedelta(days=LATE_DAYS)
        for table in RAW_TABLES:
            for day in keeper.days(table):
                if day < late_limit and keeper.drop_if_empty(conn, table, day):
                    report.dropped.append(partition_name(table, day))
        report.dropped += keeper.drop_older_than(conn, packed_retention_days, today, tables=PACKED_RETENTION_TABLES)
        if packed_retention_days > 0:  # 0 keeps everything, as for the partitions
            kept_from = day_start(today - dt.timedelta(days=packed_retention_days))
            report.unallocated_deleted = _forget_unallocated_uses(conn, kept_from)
    for day_report in report.days:
        freed = (f"{day_report.raw_bytes} raw bytes freed" if day_report.whole
                 else f"{day_report.raw_rows} raw rows deleted")
        log.info("compaction: %s until %s: %d jobs, %d samples in %d blocks, %d minutes, %d host samples; %s",
                 day_report.day, f"{day_report.until:%H:%M}", day_report.jobs, day_report.samples,
                 day_report.sample_blocks, day_report.minutes, day_report.host_samples, freed)
    return report


_FORGET_UNALLOCATED: Final = "DELETE FROM gpu_unallocated_uses WHERE ts < %(before)s"


def _forget_unallocated_uses(conn: Connection, before: dt.datetime) -> int:
    """Delete the GPU uses outside any job seen before ``before``: kept as long as the packed samples, the
    admins' record of what ran where. Not partitioned (a few rows a GPU a minute at most, and only while
    something runs outside Slurm), so a DELETE through the time index."""
    return conn.execute(_FORGET_UNALLOCATED, {"before": before}).rowcount


def spans_to_compact(
    conn: Connection, keeper: PartitionKeeper, pack_end: dt.datetime
) -> list[tuple[dt.date, dt.datetime]]:
    """(day, until) for the days whose raw partitions hold rows before ``until``: the day's end,
    or ``pack_end`` for the day it falls in."""
    days = sorted({day for table in RAW_TABLES for day in keeper.days(table) if day_start(day) < pack_end})
    # A look first, so that a day with nothing to pack gets no refusal (no lock on the running day's
    # partitions); compact_day lists the jobs again once the span refuses new rows.
    spans = []
    for day in days:
        until = min(day_start(day) + dt.timedelta(days=1), pack_end)
        if _span_jobs(conn, day, until):
            spans.append((day, until))
    return spans


def _span_jobs(conn: Connection, day: dt.date, until: dt.datetime) -> list[str]:
    """The jobs with raw GPU or host rows of ``day`` before ``until``."""
    span = {"day": day_start(day), "day_end": day_start(day) + dt.timedelta(days=1), "until": until}
    with conn.cursor(row_factory=tuple_row) as cur:
        day_jobs = _DAY_JOBS_DISTRIBUTED if _is_distributed(conn) else _DAY_JOBS
        return [row[0] for row in cur.execute(day_jobs, span).fetchall()]


def compact_day(conn: Connection, keeper: PartitionKeeper, day: dt.date, until: dt.datetime | None = None) -> DayReport:
    """Pack one day's raw GPU and host rows before ``until`` (by default the day's end), merging
    them with what their hours already have packed, and remove them from the raw tier: the whole
    day's partitions emptied, or the span's rows deleted. ``conn`` must be in autocommit."""
    start = day_start(day)
    day_end = start + dt.timedelta(days=1)
    report = DayReport(day, min(until or day_end, day_end))
    # Host rows are packed only where the day has a raw host partition (made ahead with the
    # others, so almost always), and only for the jobs that have rows in it once the span refuses
    # new ones (below): a row that lands before that is packed or stays for the next pass.
    hosts = keeper.exists("host_samples", day)
    for table in PACKED_TABLES:
        if hosts or table != "host_sample_blocks":
            keeper.ensure(conn, table, [day])
    raw = [t for t in RAW_TABLES if keeper.exists(t, day)]
    span = {"day": start, "day_end": day_end, "until": report.until}
    try:
        with conn.transaction():
            # Waits for the batches being written to the day to commit, then refuses the span's next.
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            conn.execute(_CITUS_TRIGGERS)
            for table in raw:
                conn.execute(sql.SQL(_REFUSE_ROWS).format(
                    sql.Identifier(REFUSING_TRIGGER), sql.Identifier(partition_name(table, day)),
                    sql.Literal(report.until)))
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            conn.execute(f"SET LOCAL work_mem = '{WORK_MEM}'")
            conn.execute(_CITUS_TRIGGERS)
            conn.execute(_CITUS_ONE_CONNECTION)
            if report.whole:
                report.raw_bytes = sum(
                    int(_scalar(conn, "SELECT pg_total_relation_size(%(name)s::regclass)",
                                {"name": partition_name(t, day)}))
                    for t in raw
                )
            jobs = _span_jobs(conn, day, report.until)
            report.jobs = len(jobs)
            for job in jobs:
                _pack_job(conn, report, {**span, "job": job}, raw, delete=not report.whole)
            if report.whole:
                conn.execute(sql.SQL("TRUNCATE {}").format(
                    sql.SQL(", ").join(sql.Identifier(partition_name(t, day)) for t in raw)))
    finally:
        # The refusal must not outlive the pass; if the connection is gone, the next pass lifts it.
        with suppress(psycopg.Error):
            _drop_refusing_triggers(conn)
    return report


def _pack_job(conn: Connection, report: DayReport, params: dict[str, Any], raw: list[str], *, delete: bool) -> None:
    """Pack one job's hours of the span that have raw rows; ``delete``: then delete those rows."""
    conn.execute(_ADD_DEVICES, params)
    hours: dict[dt.datetime, set[str]] = {}
    for table in raw:
        with conn.cursor(row_factory=tuple_row) as cur:
            for (hour,) in cur.execute(_JOB_HOURS[table], params).fetchall():
                hours.setdefault(hour, set()).add(table)
    for hour, tables in sorted(hours.items()):
        hour_params = {"job": params["job"], "hour": hour}
        if "gpu_samples" in tables:
            with conn.cursor(row_factory=tuple_row) as cur:
                blocks, samples = cur.execute(_PACK_SAMPLES, hour_params).fetchone() or (0, 0)
            report.sample_blocks += int(blocks)
            report.samples += int(samples)
        if "gpu_minutes" in tables:
            report.minutes += int(_scalar(conn, _PACK_MINUTES, hour_params) or 0)
        if "host_samples" in tables:
            report.host_samples += int(_scalar(conn, host_tier.PACK_HOUR, hour_params) or 0)
        if delete:
            for table in sorted(tables):
                report.raw_rows += conn.execute(_DELETE_HOUR[table], hour_params).rowcount


REFUSING_TRIGGER: Final = "jobsight_compacting"
"""The trigger that refuses rows for a day while it is packed (function in migration 0004)."""

_REFUSE_ROWS: Final = (
    "CREATE OR REPLACE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW WHEN (NEW.ts < {}) "
    "EXECUTE FUNCTION jobsight_refuse_while_compacting()"
)
"""The refusal of a span's rows (``ts`` before its end): the WHEN is evaluated without calling
the function, so the rows of the hour being written cost next to nothing."""


# On Citus the trigger goes onto the day's shards (its function is distributed by ``jobsight migrate
# --citus``: collector/store/citus.py); Citus asks for this to allow it. Elsewhere a harmless placeholder.
_CITUS_TRIGGERS: Final = "SET LOCAL citus.enable_unsafe_triggers = on"
# A day's pass writes the device dictionary (a reference table) and then reads it with the job's
# shards in one transaction: Citus allows that only over one connection per worker.
_CITUS_ONE_CONNECTION: Final = "SET LOCAL citus.multi_shard_modify_mode = 'sequential'"


DROP_LOCK_TIMEOUT: Final = "2s"
"""How long lifting a refusal waits for its lock. DROP TRIGGER takes the table's strongest lock,
and every insert into the running day queues behind it while it waits for a long read to end; a
refusal not lifted now only turns away late rows of hours already packed (503, sent again) until
the next pass lifts it."""


def _drop_refusing_triggers(conn: Connection) -> None:
    """Drop the refusing triggers this pass, or a failed or killed one, left: late rows must not be
    refused longer than a pass runs. A partition that stays busy keeps its refusal until the next pass."""
    with conn.cursor(row_factory=tuple_row) as cur:
        tables = [row[0] for row in cur.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname = %(name)s",
            {"name": REFUSING_TRIGGER},
        ).fetchall()]
    for table in tables:
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
                conn.execute(_CITUS_TRIGGERS)
                conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                    sql.Identifier(REFUSING_TRIGGER), sql.Identifier(table)))
        except psycopg.errors.LockNotAvailable:
            log.info("compaction: %s is busy; its refusal of packed hours' rows is lifted by the next pass", table)


def _skip_scan(table: str) -> str:
    """The jobs with rows of ``table`` on the day, one index probe each (a recursive CTE)."""
    return f"""{table}_jobs AS (
    (SELECT job_id FROM {table} WHERE ts >= %(day)s AND ts < %(day_end)s ORDER BY job_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.job_id FROM {table} r WHERE r.ts >= %(day)s AND r.ts < %(day_end)s
            AND r.job_id > j.job_id ORDER BY r.job_id LIMIT 1)
    FROM {table}_jobs j WHERE j.job_id IS NOT NULL
)"""


def _in_span(table: str) -> str:
    return f"""EXISTS (SELECT 1 FROM {table} r WHERE r.job_id = j.job_id
                       AND r.ts >= %(day)s AND r.ts < %(until)s)"""


# Jobs with raw rows in the span, found by skipping through the (job_id, ...) indexes of the day's
# raw partitions, then one probe each for a row in the span: two index probes per job, not a scan
# of the day (whose partition holds the current hour's rows too).
_DAY_JOBS: Final = f"""
WITH RECURSIVE {", ".join(_skip_scan(t) for t in RAW_TABLES)}
{" UNION ".join(f"SELECT job_id FROM {t}_jobs j WHERE job_id IS NOT NULL AND {_in_span(t)}" for t in RAW_TABLES)}
ORDER BY job_id
"""
# On Citus (no recursive CTE across shards): each worker lists its shards' jobs of the span.
_DAY_JOBS_DISTRIBUTED: Final = f"""
{" UNION ".join(f"SELECT DISTINCT job_id FROM {t} WHERE ts >= %(day)s AND ts < %(until)s" for t in RAW_TABLES)}
ORDER BY job_id
"""

_UTC_HOUR: Final = f"date_bin({BLOCK_INTERVAL}, ts, {HOUR_ORIGIN})"

_JOB_HOURS: Final = {
    table: f"SELECT DISTINCT {_UTC_HOUR} FROM {table} WHERE job_id = %(job)s AND ts >= %(day)s AND ts < %(until)s"
    for table in RAW_TABLES
}
"""The hours of the span in which a job has raw rows of a table (an index range of the job's rows)."""

_DELETE_HOUR: Final = {
    table: f"DELETE FROM {table} WHERE job_id = %(job)s AND ts >= %(hour)s AND ts < %(hour)s + {BLOCK_INTERVAL}"
    for table in RAW_TABLES
}
"""A job-hour's raw rows, once packed (the day still running: its partitions cannot be emptied)."""


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
      WHERE job_id = %(job)s AND ts >= %(day)s AND ts < %(until)s
      EXCEPT SELECT {", ".join(DEVICE_COLUMNS)} FROM gpu_devices) s
ORDER BY {", ".join(f"s.{c}" for c in DEVICE_COLUMNS)}
"""

_MEASURES: Final = tuple(ENCODINGS)
_STORED, _PACKED = pack_columns(ENCODINGS.values())
_TIMES, _TIME_VALUES = packed_times("t.sample_ts")

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
    WHERE s.job_id = %(job)s AND s.ts >= %(hour)s AND s.ts < %(hour)s + {BLOCK_INTERVAL}
    UNION ALL
    SELECT o.b_cluster, o.u_ts, o.b_device, {", ".join(f"o.{c}" for c in _MEASURES)}
    FROM {unpack_samples(_MEASURES, blocks="old_blocks", timelines="old_timelines", extra=("cluster", "device"))} o
), integers AS (
    SELECT s.*, {pack_integers(ENCODINGS.values())} FROM src s
), bounded AS (
    -- The window is sorted as the aggregates below want their rows: one sort serves both.
    SELECT s.*, {pack_window(ENCODINGS.values())}
    FROM integers s WINDOW g AS (PARTITION BY s.cluster, s.device ORDER BY {ORDER}
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
), packed AS (
    SELECT s.cluster, s.device, count(*)::int4 AS samples, min(s.ts) AS first_ts, max(s.ts) AS last_ts,
           array_agg(s.ts ORDER BY {ORDER}) AS sample_ts,
           {pack_aggregates(ENCODINGS.values())}
    FROM bounded s GROUP BY s.cluster, s.device
), timelines AS (
    SELECT cluster, sample_ts, (row_number() OVER (PARTITION BY cluster ORDER BY min(device)))::int4 AS timeline
    FROM packed GROUP BY cluster, sample_ts
), new_timelines AS (
    INSERT INTO gpu_sample_timelines (cluster, job_id, ts, timeline, {_TIMES})
    SELECT t.cluster, %(job)s, %(hour)s, t.timeline, {_TIME_VALUES}
    FROM timelines t, {offsets("t.sample_ts", "%(hour)s")}
), new_blocks AS (
    INSERT INTO gpu_sample_blocks (cluster, job_id, ts, device, timeline, samples, first_ts, last_ts,
                                   {_STORED})
    SELECT p.cluster, %(job)s, %(hour)s, p.device, t.timeline, p.samples, p.first_ts, p.last_ts,
           {_PACKED}
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


def _minute_array(column: str) -> str:
    if column in SAMPLE_COUNTS:  # NULL when it says "every sample" throughout the block
        return f"CASE WHEN bool_and({column} = samples) THEN NULL ELSE array_agg({column} ORDER BY ts) END"
    return f"array_agg({column} ORDER BY ts)"

# One job-hour of minutes: the raw rollup rows and the packed ones (deleted here and packed
# again), merged per GPU-minute, then one array per column and GPU.
_PACK_MINUTES: Final = f"""
WITH old AS (
    DELETE FROM gpu_minute_blocks WHERE job_id = %(job)s AND ts = %(hour)s RETURNING *
), src AS (
    SELECT cluster, ts, node, gpu_index, mig_uuid, {", ".join(MINUTE_VALUES)}
    FROM gpu_minutes WHERE job_id = %(job)s AND ts >= %(hour)s AND ts < %(hour)s + {BLOCK_INTERVAL}
    UNION ALL
    SELECT cluster, ts, node, gpu_index, mig_uuid, {", ".join(MINUTE_VALUES)} FROM {unpack_minutes(blocks="old")} o
), merged AS (
    SELECT cluster, ts, node, gpu_index, mig_uuid, {", ".join(_merged(c) for c in MINUTE_VALUES)}
    FROM src GROUP BY cluster, ts, node, gpu_index, mig_uuid
), new_blocks AS (
    INSERT INTO gpu_minute_blocks (cluster, job_id, ts, node, gpu_index, mig_uuid, minute_ts,
                                   {", ".join(MINUTE_VALUES)})
    SELECT cluster, %(job)s, {_UTC_HOUR}, node, gpu_index, mig_uuid, array_agg(ts ORDER BY ts),
           {", ".join(_minute_array(c) for c in MINUTE_VALUES)}
    FROM merged GROUP BY cluster, {_UTC_HOUR}, node, gpu_index, mig_uuid
    RETURNING cardinality(minute_ts) AS minutes
)
SELECT coalesce(sum(minutes), 0) FROM new_blocks
"""
