"""Storing one validated batch: idempotent per ``(source, seq)``, one COPY per table.

The batch id goes into ``ingest_batches`` in the same transaction as its rows
(STYLE rule 4), so a batch is stored completely once or not at all, however
often the agent retries it.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from jobsight.collector.db import Connection
from jobsight.collector.partitions import PartitionKeeper
from jobsight.collector.rollup import MinuteRollup, upsert_minutes
from jobsight.collector.schema import gpu_samples, host_samples, log_events, metrics, steps
from jobsight.collector.summaries import refresh_ended
from jobsight.protocol.wire import Batch, WireError

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# PostgreSQL type names for binary COPY, by SQLAlchemy column type name.
_PG_TYPES = {
    "TEXT": "text",
    "DATETIME": "timestamptz",
    "SMALLINTEGER": "int2",
    "INTEGER": "int4",
    "BIGINTEGER": "int8",
    "FLOAT": "float8",
    "DOUBLE": "float8",
    "BOOLEAN": "bool",
    "JSONB": "jsonb",
}

_PLAIN_COLUMNS = {
    table.name: [c.name for c in table.columns][3:] for table in (gpu_samples, host_samples, log_events, metrics, steps)
}
# attrs is the last column of log_events and the only JSON one among the series tables.
assert [c.name for c in log_events.columns][-1] == "attrs"

_SERIES_TABLES = {
    "gpu_sample": gpu_samples,
    "host_sample": host_samples,
    "log": log_events,
    "metric": metrics,
    "step": steps,
    "dropped": log_events,
}


def _copy_types(table: Any) -> list[str]:
    return [_PG_TYPES[type(column.type).__name__.upper()] for column in table.columns]


def ts_from_us(us: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=us)


@dataclass
class PreparedBatch:
    """A batch turned into table rows, ready to write. Built before any database work so a
    record that cannot be stored is rejected before anything is written."""

    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    days: dict[str, set[dt.date]] = field(default_factory=lambda: defaultdict(set))
    jobs_seen: dict[str, dt.datetime] = field(default_factory=dict)
    job_started: list[dict[str, Any]] = field(default_factory=list)
    job_ended: list[dict[str, Any]] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    minutes: MinuteRollup = field(default_factory=MinuteRollup)


def _row(table: Any, cluster: str, record: dict[str, Any], ts: dt.datetime) -> tuple[Any, ...]:
    """Values in the table's column order. Series tables start with cluster, job_id, ts."""
    get = record.get
    values = [cluster, record["job"], ts, *[get(name) for name in _PLAIN_COLUMNS[table.name]]]
    if table.name == "log_events":
        attrs = values[-1]
        values[-1] = Jsonb(attrs) if attrs is not None else None
    return tuple(values)


def _dropped_as_log(record: dict[str, Any]) -> dict[str, Any]:
    reason = record.get("reason") or "agent queue or spool full"
    return {
        **record,
        "level": "WARNING",
        "logger": "jobsight.dropped",
        "message": f"jobsight agent dropped {record['count']} records: {reason}",
        "attrs": {"dropped": record["count"], "reason": reason},
    }


def _decode_trace(record: dict[str, Any], index: int) -> bytes | None:
    blob = record.get("trace_gz_b64")
    if blob is None:
        return None
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WireError("not valid base64", index, "trace_gz_b64") from exc
    if raw[:2] != b"\x1f\x8b":
        raise WireError("trace is not gzip data", index, "trace_gz_b64")
    return raw


def prepare(batch: Batch) -> PreparedBatch:
    prepared = PreparedBatch()
    for index, record in enumerate(batch.records):
        kind = record["kind"]
        ts = ts_from_us(record["ts"])
        job = record["job"]
        prepared.counts[kind] += 1
        first = prepared.jobs_seen.get(job)
        if first is None or ts < first:
            prepared.jobs_seen[job] = ts
        if kind in _SERIES_TABLES:
            table = _SERIES_TABLES[kind]
            source = _dropped_as_log(record) if kind == "dropped" else record
            prepared.rows[table.name].append(_row(table, batch.cluster, source, ts))
            prepared.days[table.name].add(ts.date())
            if kind == "gpu_sample":
                prepared.minutes.add(record, ts)
        elif kind == "job_started":
            prepared.job_started.append({**record, "ts": ts})
        elif kind == "job_ended":
            prepared.job_ended.append({**record, "ts": ts})
        elif kind == "profile":
            prepared.profiles.append({**record, "ts": ts, "trace_gz": _decode_trace(record, index)})
    if prepared.minutes.sums:
        prepared.days["gpu_minutes"] = prepared.minutes.days()
    return prepared


_TABLES = {t.name: t for t in (gpu_samples, host_samples, log_events, metrics, steps)}
COPY_TYPES = {name: _copy_types(table) for name, table in _TABLES.items()}


def copy_sql(table_name: str) -> str:
    columns = ", ".join(f'"{c.name}"' for c in _TABLES[table_name].columns)
    return f"COPY {table_name} ({columns}) FROM STDIN WITH (FORMAT BINARY)"


def ensure_partitions(conn: Connection, keeper: PartitionKeeper, prepared: PreparedBatch) -> None:
    for table, days in prepared.days.items():
        keeper.ensure(conn, table, days)


def store(conn: Connection, batch: Batch, prepared: PreparedBatch) -> bool:
    """Write the batch inside the caller's transaction. Returns ``False`` for a replay,
    in which case nothing was written."""
    claimed = conn.execute(
        "INSERT INTO ingest_batches (source, seq, cluster, records) "
        "VALUES (%(source)s, %(seq)s, %(cluster)s, %(records)s) "
        "ON CONFLICT (source, seq) DO NOTHING RETURNING seq",
        {"source": batch.source, "seq": batch.seq, "cluster": batch.cluster, "records": len(batch.records)},
    ).fetchone()
    if claimed is None:
        return False
    _upsert_jobs_seen(conn, batch.cluster, prepared.jobs_seen)
    for record in prepared.job_started:
        _job_started(conn, batch.cluster, record)
    for table_name, rows in prepared.rows.items():
        with conn.cursor() as cur:
            with cur.copy(copy_sql(table_name)) as copy:
                copy.set_types(COPY_TYPES[table_name])
                for row in rows:
                    copy.write_row(row)
    upsert_minutes(conn, batch.cluster, prepared.minutes)
    for record in prepared.profiles:
        _profile(conn, batch.cluster, record)
    for record in prepared.job_ended:
        _job_ended(conn, batch.cluster, record)
    # Summaries of ended jobs, in this transaction: at job_ended, and again when late rows arrive.
    refresh_ended(conn, batch.cluster, list(prepared.jobs_seen))
    return True


def _upsert_jobs_seen(conn: Connection, cluster: str, seen: dict[str, dt.datetime]) -> None:
    """A record for a job the collector has not seen creates it (workstation runs have no prolog).

    Such a job starts at its earliest record. A job the prolog registered (it has a user)
    keeps the prolog's start: a training process's clock does not move Slurm's accounting."""
    if not seen:
        return
    jobs = sorted(seen)
    conn.execute(
        """INSERT INTO jobs AS j (cluster, job_id, start_time, first_seen, last_seen)
           SELECT %s, job, ts, now(), ts FROM unnest(%s::text[], %s::timestamptz[]) AS s(job, ts)
           ON CONFLICT (cluster, job_id) DO UPDATE
           SET last_seen = greatest(j.last_seen, excluded.last_seen),
               start_time = CASE WHEN j.user_name IS NULL THEN least(j.start_time, excluded.start_time)
                                 ELSE j.start_time END""",
        (cluster, jobs, [seen[j] for j in jobs]),
    )


def _job_started(conn: Connection, cluster: str, r: dict[str, Any]) -> None:
    """Merge a ``job_started`` into the job's row. Once a prolog registered the job (a record with
    ``user``, which job tokens cannot set), ``nodes`` is its Slurm allocation, which node tokens
    are authorised against (``queries.job_allocations``): run metadata no longer widens it."""
    nodes = r.get("nodes") or ([r["node"]] if r.get("node") else None)
    conn.execute(
        """UPDATE jobs SET user_name = coalesce(%(user)s, user_name), uid = coalesce(%(uid)s, uid),
               account = coalesce(%(account)s, account), partition = coalesce(%(partition)s, partition),
               name = coalesce(%(name)s, name), node_count = coalesce(%(node_count)s, node_count),
               time_limit_s = coalesce(%(time_limit_s)s, time_limit_s), demo = demo OR %(demo)s,
               attrs = coalesce(attrs, '{}'::jsonb) || coalesce(%(attrs)s, '{}'::jsonb),
               nodes = CASE
                   WHEN cardinality(%(nodes)s::text[]) = 0 THEN nodes
                   -- the first registration: its allocation replaces the nodes seen so far
                   WHEN user_name IS NULL AND %(user)s::text IS NOT NULL
                       THEN (SELECT array_agg(DISTINCT n ORDER BY n) FROM unnest(%(nodes)s::text[]) n)
                   -- another node's prolog (the same list), or nodes seen before any registration
                   WHEN user_name IS NULL OR %(user)s::text IS NOT NULL
                       THEN (SELECT array_agg(DISTINCT n ORDER BY n)
                             FROM unnest(coalesce(nodes, '{}') || %(nodes)s::text[]) n)
                   ELSE nodes END,  -- run metadata on a registered job: the allocation stays
               gpus = (SELECT array_agg(DISTINCT g ORDER BY g)
                       FROM unnest(coalesce(gpus, '{}') || %(gpus)s::text[]) g),
               start_time = CASE
                   -- no prolog: earliest record
                   WHEN user_name IS NULL AND %(user)s::text IS NULL THEN least(start_time, %(ts)s)
                   WHEN user_name IS NULL THEN %(ts)s  -- the first prolog registers the job: its time is the start
                   WHEN %(user)s::text IS NOT NULL THEN least(start_time, %(ts)s)  -- another node's prolog
                   ELSE start_time END,  -- run metadata on a registered job
               state = CASE WHEN end_time IS NULL THEN 'running' ELSE state END
           WHERE cluster = %(cluster)s AND job_id = %(job)s""",
        {
            "user": r.get("user"),
            "uid": r.get("uid"),
            "account": r.get("account"),
            "partition": r.get("partition"),
            "name": r.get("name"),
            "node_count": r.get("node_count"),
            "time_limit_s": r.get("time_limit_s"),
            "demo": bool(r.get("demo")),
            "attrs": Jsonb(r["attrs"]) if r.get("attrs") is not None else None,
            "nodes": nodes or [],
            "gpus": [f"{r.get('node') or ''}:{g}" for g in (r.get("gpus") or [])],
            "ts": r["ts"],
            "cluster": cluster,
            "job": r["job"],
        },
    )


def _job_ended(conn: Connection, cluster: str, r: dict[str, Any]) -> None:
    exit_code = r.get("exit_code")
    state = r.get("state") or ("completed" if exit_code in (0, None) else "failed")
    conn.execute(
        """UPDATE jobs SET end_time = greatest(coalesce(end_time, %(ts)s), %(ts)s),
               exit_code = CASE WHEN coalesce(exit_code, 0) = 0 THEN %(exit_code)s ELSE exit_code END,
               state = CASE WHEN state IN ('failed', 'cancelled', 'timeout', 'node_fail') THEN state ELSE %(state)s END,
               last_seen = greatest(last_seen, %(ts)s)
           WHERE cluster = %(cluster)s AND job_id = %(job)s""",
        {"ts": r["ts"], "exit_code": exit_code, "state": state, "cluster": cluster, "job": r["job"]},
    )
    conn.execute(
        """UPDATE profile_requests SET state = 'failed', reason = 'the job ended before the profile was taken',
               updated_at = now()
           WHERE cluster = %s AND job_id = %s AND state IN ('pending', 'running')""",
        (cluster, r["job"]),
    )


def _profile(conn: Connection, cluster: str, r: dict[str, Any]) -> None:
    conn.execute(
        """INSERT INTO profiles (cluster, job_id, ts, node, rank, pid, profile_id, request_id,
               step_start, step_end, summary, diagnosis, trace_gz, note)
           VALUES (%(cluster)s, %(job)s, %(ts)s, %(node)s, %(rank)s, %(pid)s, %(profile_id)s, %(request_id)s,
               %(step_start)s, %(step_end)s, %(summary)s, %(diagnosis)s, %(trace_gz)s, %(note)s)""",
        {
            "cluster": cluster,
            "job": r["job"],
            "ts": r["ts"],
            "node": r.get("node"),
            "rank": r.get("rank"),
            "pid": r.get("pid"),
            "profile_id": r["profile_id"],
            "request_id": r.get("request_id"),
            "step_start": r.get("step_start"),
            "step_end": r.get("step_end"),
            "summary": Jsonb(r["summary"]),
            "diagnosis": Jsonb(r["diagnosis"]) if r.get("diagnosis") is not None else None,
            "trace_gz": r.get("trace_gz"),
            "note": r.get("note"),
        },
    )
    if r.get("request_id") is not None:
        # The profile an on-demand request asked for: the request is done, in this transaction.
        conn.execute(
            """UPDATE profile_requests SET state = 'done', profile_id = %(profile_id)s, reason = NULL,
                   updated_at = now()
               WHERE id = %(request_id)s AND cluster = %(cluster)s AND job_id = %(job)s
                 AND state IN ('pending', 'running')""",
            {"profile_id": r["profile_id"], "request_id": r["request_id"], "cluster": cluster, "job": r["job"]},
        )

