"""Each record kind's shape is declared once (jobsight.protocol.records); this holds the rest to it.

``wire.FIELDS`` and ``GpuReading`` are derived from the declaration. The collector's tables
(collector/store/schema.py, which the migrations are checked against) cannot be: they are tied to
it here. A wire field with no column, a column no wire field fills, or a column whose type
or nullability does not fit its field fails :func:`test_tables_hold_what_the_wire_carries`,
unless :data:`STORAGE` or :data:`NOT_FROM_RECORDS` names it with the reason; so does an
integer field whose declared range (``records.Int2``/``Int4``/``Int8``) is not its column's.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import pytest
from sqlalchemy import ARRAY, BigInteger, Boolean, Column, Float, Integer, SmallInteger, Text
from sqlalchemy.dialects.postgresql import JSONB

from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.collector.ingest.write import _SERIES_TABLES
from jobsight.collector.store import schema
from jobsight.protocol import specs, wire
from jobsight.protocol.records import (
    RECORDS,
    Common,
    GpuSample,
    Int2,
    Int4,
    Int16,
    Int32,
    Int64,
    Json,
    NodeCommon,
    Percent,
    Range,
    WireSpec,
)
from jobsight.protocol.records import Text as LongText

ENVELOPE = "the batch envelope's cluster, not a record field"
KIND = "picks the table; not stored"


@dataclass(frozen=True)
class Storage:
    """Where the collector puts one kind's records (collector/ingest/write.py)."""

    table: str
    renamed: Mapping[str, str] = field(default_factory=lambda: {"job": "job_id"})
    """Wire field -> its column, where the names differ."""
    not_stored: Mapping[str, str] = field(default_factory=lambda: {"kind": KIND})
    """Wire field -> why no column holds it."""
    row_per_record: bool = True
    """Each record is one row, so a required field has a NOT NULL column and an optional one a
    nullable column. Not so for ``jobs``, which records update (coalescing) rather than insert."""


STORAGE: dict[str, Storage] = {
    # ingest._SERIES_TABLES: copied by COPY, column by column under the field's own name.
    "gpu_sample": Storage("gpu_samples"),
    "host_sample": Storage("host_samples"),
    "log": Storage("log_events"),
    "metric": Storage("metrics"),
    "step": Storage("steps"),
    "gpu_event": Storage("gpu_events"),
    # collector/ingest/unallocated_uses.py: one INSERT per batch; a node's record, no job.
    "gpu_unallocated_use": Storage("gpu_unallocated_uses", renamed={}),
    "dropped": Storage(
        "log_events",
        not_stored={
            "kind": KIND,
            "count": "becomes the WARNING line's message and attrs (ingest._dropped_as_log)",
            "reason": "becomes the WARNING line's message and attrs (ingest._dropped_as_log)",
        },
    ),
    # ingest._profile: one INSERT per record.
    "profile": Storage("profiles", renamed={"job": "job_id", "trace_gz_b64": "trace_gz"}),
    # ingest._job_started and _job_ended: both update the job's one row.
    "job_started": Storage(
        "jobs",
        renamed={"job": "job_id", "user": "user_name", "ts": "start_time"},
        not_stored={"kind": KIND, "node": "merged into nodes, and qualifies each of gpus as <node>:<gpu>",
                    "sluid": "kept in attrs under the key sluid (ingest.write._attrs)"},
        row_per_record=False,
    ),
    "job_ended": Storage(
        "jobs",
        renamed={"job": "job_id", "ts": "end_time"},
        not_stored={"kind": KIND, "node": "a job ends once, whichever node reports it"},
        row_per_record=False,
    ),
}

# Columns of the tables above that no wire field fills.
NOT_FROM_RECORDS: dict[str, dict[str, str]] = {
    "gpu_samples": {"cluster": ENVELOPE},
    "host_samples": {"cluster": ENVELOPE},
    "log_events": {"cluster": ENVELOPE},
    "metrics": {"cluster": ENVELOPE},
    "steps": {"cluster": ENVELOPE},
    "gpu_events": {"cluster": ENVELOPE},
    "gpu_unallocated_uses": {"cluster": ENVELOPE, "received_at": "the collector's clock when it stored the row"},
    "profiles": {"cluster": ENVELOPE, "id": "an identity the database assigns"},
    "jobs": {
        "cluster": ENVELOPE,
        "first_seen": "the collector's clock when it first heard of the job",
        "last_seen": "the collector's running maximum of the job's record times",
        "run_start": "the ts of the job_started that began the latest run (collector/jobs/job_runs.py)",
        "end_reason": "why jobsight cancelled the job, set by the actions pass (collector/passes/actions.py)",
    },
}

# Tables that records do not map onto field by field.
OTHER_TABLES: dict[str, str] = {
    "gpu_minutes": "per-minute sums of gpu_samples, rolled up at ingest (collector/tiers/rollup.py)",
    "gpu_hours": "per-hour sums of gpu_minutes, rolled up at ingest (collector/tiers/rollup.py)",
    "gpu_devices": "dictionary of the GPUs named by packed blocks (collector/tiers/compaction.py)",
    "gpu_sample_blocks": "packed tier: one job's samples of one GPU in one hour (collector/tiers/packed_format.py)",
    "gpu_sample_timelines": "packed tier: the sample times blocks share (collector/tiers/compaction.py)",
    "gpu_minute_blocks": "packed tier of gpu_minutes (collector/tiers/compaction.py)",
    "host_sample_blocks": "packed tier of host_samples, a node's samples per hour (collector/tiers/host_tier.py)",
    "step_minutes": "per-minute sums of training steps per rank, rolled up at ingest (collector/tiers/step_rollup.py)",
    "epoch_starts": "first training step of each epoch, kept at ingest (collector/tiers/step_rollup.py)",
    "job_summaries": "computed by the collector when a job ends",
    "job_runs": "a requeued job's earlier runs, closed when the next starts (collector/jobs/job_runs.py)",
    "ingest_batches": "one row per batch envelope (source, seq), for idempotence",
    "profile_requests": "on-demand profile requests made through the API",
    "findings": "what the health rules noticed about running jobs (collector/passes/findings.py)",
    "alert_outbox": "alerts to send for findings, written with them (collector/passes/alerts.py)",
    "actions": "the steps waste policies took for open findings (collector/passes/actions.py)",
    "notices": "warnings, job-end and periodic reports to send to people (collector/passes/notices.py)",
}

# Fields stored in a column of another type: their values are converted on the way in.
CONVERTED: dict[str, str] = {
    "ts": "microseconds since the epoch become a timestamptz (ingest.ts_from_us)",
    "trace_gz_b64": "base64 is decoded into the bytea trace_gz (ingest._decode_trace)",
}

# The column types a wire spec (without its "?") may be stored in; subclasses count
# (Integer covers SmallInteger and BigInteger, Float covers Double).
COLUMN_TYPES: dict[str, type[Any]] = {
    "str": Text,
    "text": Text,
    "int": Integer,
    "float": Float,
    "bool": Boolean,
    "json": JSONB,
    "str_list": ARRAY,
    "int_list": ARRAY,
}
LIST_ITEMS: dict[str, type[Any]] = {"str_list": Text, "int_list": Integer}
# What each PostgreSQL integer column holds (exact types: SmallInteger and BigInteger are
# subclasses of Integer).
COLUMN_RANGES: dict[type[Any], Range] = {SmallInteger: Int16, Integer: Int32, BigInteger: Int64}

Fields = Mapping[str, Mapping[str, str]]
Ranges = Mapping[str, Mapping[str, Range]]
Tables = Mapping[str, Mapping[str, Column[Any]]]


def wire_records() -> dict[str, dict[str, str]]:
    """Every kind's fields as the validator sees them: the common fields, then the kind's own."""
    return {kind: {**wire.COMMON_FIELDS[kind], **fields} for kind, fields in wire.FIELDS.items()}


def column_range(column: Column[Any]) -> Range | None:
    """The values an integer column (or an array of them) holds; ``None`` for other columns."""
    column_type = column.type.item_type if isinstance(column.type, ARRAY) else column.type
    return COLUMN_RANGES.get(type(column_type))


def schema_tables() -> dict[str, dict[str, Column[Any]]]:
    return {table.name: {c.name: c for c in table.columns} for table in schema.metadata.sorted_tables}


def _column_problem(
    where: str, spec: str, declared: Range | None, column: Column[Any], row_per_record: bool
) -> str | None:
    base = spec.rstrip("?")
    if not isinstance(column.type, COLUMN_TYPES[base]):
        return f"{where}: a {spec!r} field, but the column is {column.type!r}"
    if base in LIST_ITEMS and not isinstance(column.type.item_type, LIST_ITEMS[base]):
        return f"{where}: a {spec!r} field, but the column is {column.type!r}"
    if row_per_record and column.nullable != spec.endswith("?"):
        wanted = "nullable" if spec.endswith("?") else "NOT NULL"
        return f"{where}: a {spec!r} field, but the column is not {wanted}"
    held = column_range(column)
    narrower = declared is not None and held is not None and held.lo <= declared.lo <= declared.hi <= held.hi
    if base in ("int", "int_list") and declared != held and not narrower:
        return f"{where}: declared {_span(declared)}, but the column is {column.type!r} ({_span(held)})"
    return None


def _span(bounds: Range | None) -> str:
    return f"{bounds.lo}..{bounds.hi}" if bounds is not None else "no range"


def shape_problems(
    records: Fields,
    tables: Tables,
    ranges: Ranges = wire.RANGES,
    storage: Mapping[str, Storage] = STORAGE,
    not_from_records: Mapping[str, Mapping[str, str]] = NOT_FROM_RECORDS,
    other_tables: Mapping[str, str] = OTHER_TABLES,
) -> list[str]:
    """Every way the tables and the wire disagree, one line each (empty when they agree)."""
    problems: list[str] = []
    filled: dict[str, set[str]] = defaultdict(set)
    for kind, fields in records.items():
        where = storage.get(kind)
        if where is None:
            problems.append(f"{kind}: a record kind with no table in STORAGE")
            continue
        columns = tables[where.table]
        for name in sorted({*where.renamed, *where.not_stored} - set(fields)):
            problems.append(f"{kind}.{name}: STORAGE names a field the wire does not have")
        for name, spec in fields.items():
            if name in where.not_stored:
                continue
            column_name = where.renamed.get(name, name)
            column = columns.get(column_name)
            if column is None:
                problems.append(f"{kind}.{name}: a wire field with no column {where.table}.{column_name}")
                continue
            filled[where.table].add(column_name)
            if name not in CONVERTED:
                problem = _column_problem(f"{kind}.{name} -> {where.table}.{column_name}", spec,
                                          ranges[kind].get(name), column, where.row_per_record)
                if problem is not None:
                    problems.append(problem)
    for table, columns in tables.items():
        if table in other_tables:
            continue
        if table not in filled:
            problems.append(f"{table}: a table that no record kind fills and OTHER_TABLES does not name")
            continue
        elsewhere = not_from_records.get(table, {})
        for column_name in columns:
            if column_name not in filled[table] and column_name not in elsewhere:
                problems.append(f"{table}.{column_name}: a column that no wire field fills")
        for column_name in elsewhere:
            if column_name in filled[table] or column_name not in columns:
                problems.append(f"{table}.{column_name}: NOT_FROM_RECORDS names it, but it is filled or gone")
    return problems


def test_tables_hold_what_the_wire_carries() -> None:
    assert shape_problems(wire_records(), schema_tables()) == []


def test_the_check_sees_drift() -> None:
    """The check above can fail: every kind of drift, made on copies, is reported."""
    records, tables = wire_records(), schema_tables()

    extra_field = {**records, "gpu_sample": {**records["gpu_sample"], "fan_pct": "float?"}}
    assert shape_problems(extra_field, tables) == [
        "gpu_sample.fan_pct: a wire field with no column gpu_samples.fan_pct"
    ]

    extra_column = {**tables, "steps": {**tables["steps"], "loss": Column("loss", Float)}}
    assert shape_problems(records, extra_column) == ["steps.loss: a column that no wire field fills"]

    fewer_fields = {**records, "host_sample": {k: v for k, v in records["host_sample"].items() if k != "mem_limit"}}
    assert shape_problems(fewer_fields, tables) == ["host_samples.mem_limit: a column that no wire field fills"]

    retyped = {**tables, "gpu_samples": {**tables["gpu_samples"], "temp_c": Column("temp_c", Integer)}}
    assert shape_problems(records, retyped) == [
        "gpu_sample.temp_c -> gpu_samples.temp_c: a 'float?' field, but the column is Integer()"
    ]

    required = {**records, "metric": {**records["metric"], "step": "int"}}
    assert shape_problems(required, tables) == [
        "metric.step -> metrics.step: a 'int' field, but the column is not NOT NULL"
    ]

    ranges = wire.RANGES
    wider = {**ranges, "gpu_sample": {**ranges["gpu_sample"], "gpu_index": Int32}}
    assert shape_problems(records, tables, wider) == [
        "gpu_sample.gpu_index -> gpu_samples.gpu_index: declared -2147483648..2147483647, but the column is "
        "SmallInteger() (-32768..32767)"
    ]

    narrower_column = {**tables, "log_events": {**tables["log_events"], "tid": Column("tid", Integer)}}
    assert shape_problems(records, narrower_column) == [
        "log.tid -> log_events.tid: declared -9223372036854775808..9223372036854775807, but the column is "
        "Integer() (-2147483648..2147483647)"
    ]

    new_kind = {**records, "energy": {**records["dropped"]}}
    assert shape_problems(new_kind, tables) == ["energy: a record kind with no table in STORAGE"]

    new_table = {**tables, "energy": {"cluster": Column("cluster", Text)}}
    assert shape_problems(records, new_table) == [
        "energy: a table that no record kind fills and OTHER_TABLES does not name"
    ]


def test_the_rollup_holds_what_gpu_samples_carry() -> None:
    """gpu_minutes (not a table records map onto) repeats gpu_samples' key columns: each
    integer among them must hold what the gpu_sample field's declared range lets through."""
    minutes = {c.name: c for c in schema.gpu_minutes.columns}
    shared = [name for name in wire.RANGES["gpu_sample"] if name in minutes and name not in CONVERTED]
    assert shared == ["gpu_index"]
    for name in shared:
        assert column_range(minutes[name]) == wire.RANGES["gpu_sample"][name], name


def test_the_integer_ranges_are_the_columns() -> None:
    """Spelled out for the fields the issue named: a value the validator takes fits its column."""
    assert wire.RANGES["gpu_sample"]["gpu_index"] == Int16
    assert wire.RANGES["job_started"]["uid"] == Int32
    for kind in ("log", "metric", "step", "profile"):
        assert (wire.RANGES[kind]["rank"], wire.RANGES[kind]["pid"]) == (Range(0, 2**31 - 1), Int32), kind
    for kind in ("log", "metric", "step"):
        assert wire.RANGES[kind]["tid"] == Int64, kind  # bigint in every table
    assert (wire.RANGES["step"]["samples"], wire.RANGES["gpu_sample"]["sm_clock_mhz"]) == (Int32, Int32)


def test_series_kinds_go_where_ingest_sends_them() -> None:
    # ingest copies series records column by column under the field's own name: only the
    # envelope's job id is renamed, so STORAGE cannot hide a rename ingest does not make.
    for kind, table in _SERIES_TABLES.items():
        assert STORAGE[kind].table == table.name, kind
        assert STORAGE[kind].renamed == {"job": "job_id"}, kind


def test_derived_fields() -> None:
    assert wire.KINDS == tuple(RECORDS) == (
        "gpu_sample", "host_sample", "log", "metric", "step", "profile", "job_started", "job_ended", "dropped",
        "gpu_event", "gpu_unallocated_use",
    )
    assert specs.wire_fields(Common) == {"kind": "str", "job": "str", "ts": "int", "node": "str?"}
    assert wire.COMMON_FIELDS["gpu_unallocated_use"] == {"kind": "str", "ts": "int", "node": "str"}
    gpu = wire.FIELDS["gpu_sample"]
    assert list(gpu)[:4] == ["gpu_index", "gpu_uuid", "gpu_name", "mig_uuid"]
    assert (gpu["gpu_index"], gpu["gpu_uuid"], gpu["util_gpu"], gpu["mem_used"], gpu["lost"]) == (
        "int", "str", "float?", "int?", "bool?",
    )
    log = wire.FIELDS["log"]
    assert (log["level"], log["message"], log["exception"], log["attrs"]) == ("str", "text", "text?", "json?")
    assert wire.FIELDS["metric"] == {
        "rank": "int?", "pid": "int?", "tid": "int?", "step": "int?", "name": "str", "value": "float",
    }
    assert wire.FIELDS["profile"]["summary"] == "json"
    assert wire.FIELDS["profile"]["trace_gz_b64"] == "text?"
    assert wire.FIELDS["job_started"]["nodes"] == "str_list?"
    assert wire.FIELDS["dropped"] == {"count": "int", "reason": "str?"}
    assert wire.FIELDS["gpu_event"] == {"gpu_index": "int", "gpu_uuid": "str", "event": "str", "code": "int"}
    assert list(gpu)[-7:] == [
        "nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors", "pcie_replays",
        "remapped_rows_pending", "remap_failure", "retired_pages_pending",
    ]


def test_the_validator_follows_the_declaration() -> None:
    now = wire.now_us()
    record = {"kind": "log", "job": "1", "ts": now, "level": "INFO", "message": "x" * (wire.MAX_STRING + 1)}
    assert wire.validate_record(record, 0, now) is record  # text: the long cap
    with pytest.raises(wire.WireError) as caught:
        wire.validate_record({**record, "logger": "x" * (wire.MAX_STRING + 1)}, 0, now)
    assert caught.value.field == "logger"  # str: the short cap
    with pytest.raises(wire.WireError) as caught:
        wire.validate_record({"kind": "gpu_sample", "job": "1", "ts": now, "gpu_index": 0}, 0, now)
    assert (caught.value.field, caught.value.message) == ("gpu_uuid", "required field is missing")


@pytest.mark.parametrize(
    ("hint", "spec"),
    [
        (str, "str"),
        (LongText, "text"),
        (int | None, "int?"),
        (bool, "bool"),
        (Json | None, "json?"),
        (list[str] | None, "str_list?"),
        (list[int], "int_list"),
        (Annotated[str, "not a WireSpec", WireSpec("text")], "text"),
        (Int2, "int"),
        (Int4 | None, "int?"),
        (Percent | None, "float?"),
    ],
)
def test_spec_of(hint: Any, spec: str) -> None:
    assert specs.spec_of(hint) == spec


@pytest.mark.parametrize(
    "hint",
    [
        int | str, int | str | None, dict[str, int], list[float], bytes, Annotated[str, 1],
        Annotated[str, Int32], Annotated[int, Int32, Int16], Annotated[int, Int32, WireSpec("text")],
    ],
)
def test_spec_of_refuses_what_the_validator_cannot_check(hint: Any) -> None:
    with pytest.raises(TypeError):
        specs.spec_of(hint)


@pytest.mark.parametrize(
    ("hint", "bounds"),
    [(Int2, Int16), (Int4 | None, Int32), (int, Int64), (Percent | None, Range(0.0, 100.0)),
     (float, specs.FINITE), (str, None), (Json, None)],
)
def test_range_of(hint: Any, bounds: Range | None) -> None:
    assert specs.range_of(hint) == bounds


@pytest.mark.parametrize("shape", [Common, NodeCommon, *RECORDS.values()])
def test_optional_fields_and_only_they_have_defaults(shape: type[Any]) -> None:
    field_specs = specs.wire_fields(shape)
    for f in dataclasses.fields(shape):
        has_default = f.default is not dataclasses.MISSING
        assert has_default == field_specs[f.name].endswith("?"), f"{shape.__name__}.{f.name}"


def test_gpu_reading_is_a_gpu_sample_plus_processes() -> None:
    assert [f.name for f in dataclasses.fields(GpuReading)] == [*wire.FIELDS["gpu_sample"], "processes"]
    assert issubclass(GpuReading, GpuSample)
    reading = GpuReading(3, "GPU-3", "H100", None, util_gpu=50.0, processes=[(42, 0)])
    record = reading.to_record()
    assert list(record) == list(wire.FIELDS["gpu_sample"])
    assert (record["gpu_index"], record["util_gpu"], record["mem_used"], record["lost"]) == (3, 50.0, None, False)
    now = wire.now_us()
    wire.validate_record({"kind": "gpu_sample", "job": "1", "ts": now, **record}, 0, now)
