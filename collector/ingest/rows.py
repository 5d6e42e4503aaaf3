"""A validated batch turned into table rows: :func:`prepare`, run in the decode thread.

Everything a batch's records become is built here, before any database work, so that a
record that cannot be stored is refused before anything is written and the group-commit
writer (:mod:`jobsight.collector.ingest.group_commit`) only streams rows. This is the hot path of
ingest (it runs once per record), so it works kind by kind over lists: one comprehension
builds a table's rows, and times stay integer microseconds: rows carry them as COPY sends a
timestamptz (:data:`COPY_TYPES`), days and job spans are computed on them.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Final

from psycopg.types.json import Jsonb

from jobsight.collector.ingest import minute_rollup
from jobsight.collector.store.schema import gpu_events, gpu_samples, host_samples, log_events, metrics, steps
from jobsight.collector.store.timestamps import days_of_us, ts_from_us
from jobsight.collector.tiers.rollup import MinuteRollup
from jobsight.collector.tiers.step_rollup import StepRollup
from jobsight.protocol.wire import Batch, WireError

# PostgreSQL type names for binary COPY, by SQLAlchemy column type name.
_PG_TYPES: Final = {
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

_TABLES: Final = {t.name: t for t in (gpu_samples, host_samples, log_events, metrics, steps, gpu_events)}
SERIES_TABLES: Final = {
    "gpu_sample": gpu_samples,
    "host_sample": host_samples,
    "log": log_events,
    "metric": metrics,
    "step": steps,
    "dropped": log_events,
    "gpu_event": gpu_events,
}
"""The record kinds copied into a time-series table, each field into the column of its name."""

# Series tables start with cluster, job_id, ts; the other columns are record fields of that name.
_PLAIN_COLUMNS: Final = {name: tuple(c.name for c in table.columns)[3:] for name, table in _TABLES.items()}
# attrs is the last column of log_events and the only JSON one among the series tables.
assert [c.name for c in log_events.columns][-1] == "attrs"

PG_EPOCH_US: Final = 946684800 * 1_000_000
"""PostgreSQL's epoch (2000-01-01 UTC) in µs since the Unix epoch."""

# Binary COPY sends a timestamptz as its internal form, an int8 of microseconds since
# PostgreSQL's epoch. The ``ts`` of a row is that integer, sent as "int8" (the same eight
# bytes): building a ``datetime`` for every row, for psycopg to take apart again, was
# about 0.8 µs of the 1.7 µs a row cost to build. Every other column is sent as its own type.
COPY_TYPES: Final = {
    name: ["int8" if column.name == "ts" else _PG_TYPES[type(column.type).__name__.upper()] for column in table.columns]
    for name, table in _TABLES.items()
}
assert all(table.columns[2].name == "ts" for table in _TABLES.values())


def _copy_statement(name: str) -> str:
    columns = ", ".join(f'"{column.name}"' for column in _TABLES[name].columns)
    return f"COPY {name} ({columns}) FROM STDIN WITH (FORMAT BINARY)"


COPY_SQL: Final = {name: _copy_statement(name) for name in _TABLES}
"""One COPY statement per table, built once (the writer runs one per table and group)."""


def copy_sql(table_name: str) -> str:
    return COPY_SQL[table_name]


JobSpan = tuple[int, int]
"""The first and last record time of a job in a batch, in µs since the epoch."""


@dataclass(slots=True)
class PreparedBatch:
    """A batch turned into table rows, ready to write."""

    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    days: dict[str, set[dt.date]] = field(default_factory=dict)
    jobs_seen: dict[str, JobSpan] = field(default_factory=dict)
    job_started: list[dict[str, Any]] = field(default_factory=list)
    job_ended: list[dict[str, Any]] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    unallocated_uses: list[dict[str, Any]] = field(default_factory=list)
    """``gpu_unallocated_use`` records (a node's, naming no job), ``ts`` as a datetime."""
    counts: dict[str, int] = field(default_factory=dict)
    minutes: MinuteRollup = field(default_factory=MinuteRollup)
    step_minutes: StepRollup = field(default_factory=StepRollup)
    """The batch's per-minute sums, built and written by :mod:`jobsight.collector.ingest.minute_rollup`."""
    sender: str = "admin"
    """Who sent the batch (:func:`jobsight.collector.ingest.write_rights.sender_of`), set once it is authorised: its
    id ``(source, seq)`` is unique per sender in the ledger."""


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


def _series_rows(
    cluster: str, table: str, records: list[dict[str, Any]], columns: dict[str, list[Any]]
) -> list[tuple[Any, ...]]:
    """Rows in the table's column order, ``ts`` as COPY sends it (see :data:`COPY_TYPES`).
    Built a column at a time and zipped, all in C: the columns validation made
    (:attr:`Batch.columns`), and the others fetched here."""
    def column(name: str) -> list[Any]:
        given = columns.get(name)
        return given if given is not None else list(map(dict.get, records, repeat(name)))

    epoch = PG_EPOCH_US
    times = [us - epoch for us in column("ts")]
    jobs = list(map(dict.__getitem__, records, repeat("job")))
    rows = list(zip(repeat(cluster), jobs, times, *map(column, _PLAIN_COLUMNS[table])))
    if table == "log_events":
        rows = [(*row[:-1], Jsonb(row[-1])) if row[-1] is not None else row for row in rows]
    return rows


def _add_spans(spans: dict[str, JobSpan], records: list[dict[str, Any]], times: list[int]) -> None:
    jobs = {r["job"] for r in records}
    if len(jobs) == 1:  # the usual batch: one job
        job = jobs.pop()
        first, last = min(times), max(times)
        seen = spans.get(job)
        spans[job] = (first, last) if seen is None else (min(seen[0], first), max(seen[1], last))
        return
    for record, us in zip(records, times, strict=True):
        job = record["job"]
        seen = spans.get(job)
        spans[job] = (us, us) if seen is None else (min(seen[0], us), max(seen[1], us))


def prepare(batch: Batch) -> PreparedBatch:
    prepared = PreparedBatch()
    records = batch.records
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        kind = record["kind"]
        same = by_kind.get(kind)
        if same is None:
            by_kind[kind] = [record]
        else:
            same.append(record)
    prepared.counts = {kind: len(same) for kind, same in by_kind.items()}
    for kind, same in by_kind.items():
        if kind == "gpu_unallocated_use":  # about a node, not a job: no job row, span or rollup
            prepared.unallocated_uses.extend({**r, "ts": ts_from_us(r["ts"])} for r in same)
            continue
        times = [r["ts"] for r in same]
        _add_spans(prepared.jobs_seen, same, times)
        table = SERIES_TABLES.get(kind)
        if table is not None:
            source = [_dropped_as_log(r) for r in same] if kind == "dropped" else same
            given = batch.columns.get(kind, {}) if batch.columns is not None and kind != "dropped" else {}
            rows = _series_rows(batch.cluster, table.name, source, given)
            prepared.rows.setdefault(table.name, []).extend(rows)
            prepared.days.setdefault(table.name, set()).update(days_of_us(times))
            minute_rollup.add_rows(prepared.minutes, prepared.step_minutes, kind, rows, times)
        elif kind in ("job_started", "job_ended"):
            target = prepared.job_started if kind == "job_started" else prepared.job_ended
            target.extend({**r, "ts": ts_from_us(r["ts"])} for r in same)
    if "profile" in by_kind:
        # Errors name the record's index in the batch, so look the profiles up by position.
        prepared.profiles = [
            {**r, "ts": ts_from_us(r["ts"]), "trace_gz": _decode_trace(r, index)}
            for index, r in enumerate(records)
            if r["kind"] == "profile"
        ]
    prepared.days.update(minute_rollup.days(prepared.minutes, prepared.step_minutes))
    return prepared


def prepare_without(batch: Batch, refused: Collection[int]) -> tuple[Batch, PreparedBatch]:
    """``batch`` without the records at the indices ``refused``, prepared anew: no row, rollup,
    partition day or job span of a refused record is left in what is written."""
    kept = [record for index, record in enumerate(batch.records) if index not in refused]
    rewritten = Batch(batch.source, batch.seq, batch.sent_at, batch.cluster, kept)
    return rewritten, prepare(rewritten)
