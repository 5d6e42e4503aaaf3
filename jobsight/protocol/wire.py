"""The wire protocol between agents and the collector, shared by both sides.

A batch is gzip-compressed JSON::

    {"v": 1, "source": "node42:agent", "seq": 17, "sent_at": 1763769600.0,
     "cluster": "default", "records": [{"kind": "log", "job": "123", "ts": ..., ...}]}

``(source, seq)`` identifies a batch: the collector stores a batch once however
often it is sent. Every record carries ``kind``, ``job`` (the Slurm job id, or
``local-<host>-<pid>-<start>`` outside Slurm; refused unless ``slurm_ids.is_job_id`` takes it)
and ``ts`` (microseconds since the Unix epoch, UTC). A record about a node rather than a job
(``records.NODE_KINDS``: a GPU used outside any job) has no ``job`` and must name its ``node``.

Each kind's fields are declared once, in :mod:`jobsight.protocol.records`; ``FIELDS``
(and ``RANGES``, the bounds of numbers) are derived from there by
:mod:`jobsight.protocol.specs`; the checks of one value beyond its type are
:mod:`jobsight.protocol.checks`'. Validation lives here, in the standard library only, because
the agent must import with nothing but the ``agent`` extra installed. The collector
runs the same checks and turns a :class:`WireError` into a 422 naming the record and
the field.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from typing import Any, Final

from jobsight.protocol import checks

try:  # the agent's extra brings orjson; without it the standard library serialises batches
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised where the agent runs without the extra
    _orjson = None  # type: ignore[assignment]
from jobsight.protocol.records import NODE_KINDS, RECORDS, Int64, Range, common_of
from jobsight.protocol.sluid import sluid_problem
from jobsight.protocol.slurm_ids import is_job_id
from jobsight.protocol.specs import FINITE, wire_contents, wire_fields, wire_ranges

VERSION: Final = 1
MAX_STRING: Final = 4096
MAX_MESSAGE: Final = 65536
MAX_RECORDS: Final = 20000
MAX_JSON_DEPTH: Final = 16
"""Containers nested in a JSON field, at most."""
_DAY_US: Final = 86400 * 1_000_000
# Timestamps before this or more than a day ahead of the collector's clock are
# almost always unit mistakes (seconds or nanoseconds passed as microseconds).
MIN_TS_US: Final = 946684800 * 1_000_000  # 2000-01-01
FUTURE_SLACK_US: Final = _DAY_US
# Each UTC day of a time-series record is a daily partition, which the collector creates in
# the request when it is missing. Late records are normal (a spool replayed after an outage),
# so a week back is taken; older records, and one batch spread over many days, are refused, so
# that no body can make the collector create partitions by the hundred. A record may be from
# 7 days back to 1 ahead (FUTURE_SLACK_US), a window that touches 9 UTC days unless it starts
# at midnight: a batch may touch 8 of them. No agent's batch comes near (its records span
# seconds, and a spooled batch is replayed as it was sent).
MAX_RECORD_AGE_DAYS: Final = 7
MAX_BATCH_DAYS: Final = 8

# Field specs by kind, derived from jobsight.protocol.records, the one declaration of each
# kind's shape (add or change a field there, not here): "str", "text" (long string), "int",
# "float", "bool", "json" (any JSON-safe value), "int_list", "str_list"; a trailing "?"
# means the field may be absent or null. Key order is declaration order, which is the order
# fields are checked in.
KINDS: Final[tuple[str, ...]] = tuple(RECORDS)
COMMON_FIELDS: Final[dict[str, dict[str, str]]] = {kind: wire_fields(common_of(kind)) for kind in RECORDS}
"""The fields each kind starts with (``records.Common``, or ``records.NodeCommon`` for a node's kinds)."""
FIELDS: Final[dict[str, dict[str, str]]] = {kind: wire_fields(shape) for kind, shape in RECORDS.items()}
# The bounds of every int and float field by kind, common fields included; also derived.
RANGES: Final[dict[str, dict[str, Range]]] = {
    kind: {**wire_ranges(common_of(kind)), **wire_ranges(shape)} for kind, shape in RECORDS.items()
}
NOT_A_JOB_ID: Final = ("not a job id (letters, digits and _.+- up to 128 characters, "
                       "the first a letter or a digit)")

# The profile trace is a gzip blob in base64; it has its own, larger cap, and a cap on what
# it inflates to, so that no trace is a gzip bomb. The agent leaves out a trace over either
# (agent/traces/trace_packing.pack_trace); the collector's format=json download has the same
# 256 MiB cap (collector/query/traces.py).
MAX_TRACE_B64: Final = 16 * 1024 * 1024
MAX_TRACE_INFLATED: Final = 256 * 1024 * 1024


class WireError(ValueError):
    """A batch or record that breaks the protocol.

    ``record`` is the index in ``records`` (``None`` for the envelope) and ``field``
    the offending field (``None`` when the whole record or body is at fault).
    """

    def __init__(self, message: str, record: int | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.record = record
        self.field = field

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.message, "record": self.record, "field": self.field}


Columns = dict[str, dict[str, list[Any]]]
"""Kind -> field -> that field's value in each record of the kind, in batch order."""


@dataclass(frozen=True)
class Batch:
    source: str
    seq: int
    sent_at: float
    cluster: str
    records: list[dict[str, Any]]
    columns: Columns | None = field(default=None, compare=False, repr=False)
    """The checked fields of each kind, a column each, when the batch was checked a field at a
    time (:func:`validate_records`); the collector builds its rows from them."""


def now_us() -> int:
    return time.time_ns() // 1000


def encode_batch(
    source: str, seq: int, records: list[dict[str, Any]], cluster: str = "default"
) -> bytes:
    """Serialise and gzip a batch. Raises ``ValueError`` for NaN/Infinity values."""
    envelope = {
        "v": VERSION,
        "source": source,
        "seq": seq,
        "sent_at": time.time(),
        "cluster": cluster,
        "records": records,
    }
    body = _dumps(envelope, records)
    # Level 1: telemetry batches repeat their keys record after record, which the fastest level
    # already takes out (a node daemon's 90-record batch: 1,043 bytes at level 1, 1,000 at 5),
    # at a third of the CPU, and that CPU is the training node's.
    return gzip.compress(body, compresslevel=1)


_INF: Final = float("inf")


def _all_finite(values: Any) -> bool:
    """No NaN or infinity among ``values``, in nested dicts, lists and tuples too. Exact types
    only: orjson refuses subclasses (see :func:`_dumps`), so they never reach it."""
    for value in values:
        kind = type(value)
        if kind is float:
            if value != value or value == _INF or value == -_INF:
                return False
        elif kind is dict:
            if not _all_finite(value.values()):
                return False
        elif (kind is list or kind is tuple) and not _all_finite(value):
            return False
    return True


def _dumps(envelope: dict[str, Any], records: list[dict[str, Any]]) -> bytes:
    """The batch as compact JSON. orjson when it is installed: a node daemon's batch in a
    tenth of the standard library's time, and that CPU is the training node's. orjson writes
    NaN and infinity as ``null``, so a batch holding one gets the standard library's verdict
    (``ValueError``), as does anything orjson is told not to take (datetimes, dataclasses,
    subclasses) or cannot (integers past 64 bits, numpy scalars, keys that are not strings):
    ``TypeError`` where the standard library refuses it too. (A ``uuid.UUID`` orjson writes
    as its string, where the standard library refuses it.)"""
    if _orjson is not None and all(type(r) is dict and _all_finite(r.values()) for r in records):
        try:
            return _orjson.dumps(envelope, option=_ORJSON_PLAIN)
        except TypeError:  # integers past 64 bits, numpy scalars, subclasses, non-str keys
            pass
    return json.dumps(envelope, separators=(",", ":"), allow_nan=False).encode()


_ORJSON_PLAIN: Final = (
    0 if _orjson is None
    else _orjson.OPT_PASSTHROUGH_DATETIME | _orjson.OPT_PASSTHROUGH_DATACLASS | _orjson.OPT_PASSTHROUGH_SUBCLASS
)


def loads_batch(raw: bytes) -> Any:
    """Parse JSON. NaN and Infinity parse (as Python's json does) so that validation can
    name the record and field that holds them, rather than failing the whole body."""
    return json.loads(raw)


def _shown(name: str) -> str:
    """A name from the body (an unknown field) as an error may repeat it: escaped where it holds
    a lone surrogate, which no JSON answer can encode, and cut short."""
    if not name.isascii() and checks.lone_surrogate(name):
        name = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return name if len(name) <= 256 else name[:255] + "…"


def _check_string(value: str, limit: int, index: int | None, field: str) -> None:
    problem = checks.string_problem(value, limit)
    if problem is not None:
        raise WireError(problem, index, field)


@dataclass(frozen=True)
class _Rule:
    """One field as the general (slow) path checks it, precomputed from its declaration."""

    kind: str
    """Its spec without the ``"?"``; a list's items have the item's kind."""
    limit: int
    """Characters, for strings."""
    bounds: Range
    """For ints and floats (and lists of them)."""
    content: Callable[[Any], str | None] | None
    is_list: bool


_CONTENT_CHECKS: Final[dict[str, Callable[[Any], str | None]]] = {
    "object": checks.object_problem,
    "hints": checks.hints_problem,
    "gzip_base64": lambda value: checks.gzip_base64_problem(value, MAX_TRACE_INFLATED),
    "sluid": sluid_problem,
}
_CONTENT_LIMITS: Final = {"gzip_base64": MAX_TRACE_B64}


def _rule(spec: str, bounds: Range | None, content: str | None) -> _Rule:
    base = spec.rstrip("?")
    kind = base.removesuffix("_list")
    if content is not None and content not in _CONTENT_CHECKS:
        raise TypeError(f"no check for Content({content!r})")
    limit = _CONTENT_LIMITS.get(content or "", MAX_STRING if kind == "str" else MAX_MESSAGE)
    return _Rule(kind, limit, bounds or Int64, _CONTENT_CHECKS[content] if content else None, base != kind)


def _check_field(value: Any, rule: _Rule, index: int, field: str) -> None:
    if rule.is_list:
        if not isinstance(value, list) or len(value) > 4096:
            raise WireError("expected a list", index, field)
        item_rule = replace(rule, is_list=False)
        for item in value:
            if item is None:
                raise WireError("null in a list", index, field)
            _check_field(item, item_rule, index, field)
        return
    kind = rule.kind
    problem: str | None = None
    if kind in ("str", "text"):
        if not isinstance(value, str):
            raise WireError("expected a string", index, field)
        problem = checks.string_problem(value, rule.limit)
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError("expected an integer", index, field)
        problem = checks.integer_problem(value, rule.bounds)
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError("expected a number", index, field)
        problem = checks.number_problem(value, rule.bounds)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise WireError("expected true or false", index, field)
    elif kind == "json":
        problem = checks.json_problem(value, MAX_JSON_DEPTH, MAX_MESSAGE, MAX_STRING)
    if problem is None and rule.content is not None:
        problem = rule.content(value)
    if problem is not None:
        raise WireError(problem, index, field)


_FAST_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "float": (float, int), "int": (int,), "str": (str,), "text": (str,), "bool": (bool,)
}
_CONTENTS: Final = {kind: {**wire_contents(common_of(kind)), **wire_contents(shape)} for kind, shape in RECORDS.items()}


def _fast_entry(kind: str, name: str, spec: str) -> tuple[str, bool, tuple[type, ...], float, float, _Rule]:
    """A field as the fast path reads it: its name, whether it may be null, the types the fast
    path decides (none for a field whose content needs a check), the most and least a number
    may be (the characters a string may have, as ``hi``), and the general path's rule."""
    content = _CONTENTS[kind].get(name)
    rule = _rule(spec, RANGES[kind].get(name), content)
    fast_types = () if content else _FAST_TYPES.get(spec.rstrip("?"), ())
    lo, hi = (0, rule.limit) if rule.kind in ("str", "text") else (rule.bounds.lo, rule.bounds.hi)
    return name, spec.endswith("?"), fast_types, lo, hi, rule


_FIELD_SPECS: Final = {
    kind: tuple(_fast_entry(kind, name, spec) for name, spec in (*COMMON_FIELDS[kind].items(), *fields.items()))
    for kind, fields in FIELDS.items()
}
_ALLOWED: Final = {kind: frozenset(fields) | frozenset(COMMON_FIELDS[kind]) for kind, fields in FIELDS.items()}


def validate_record(record: Any, index: int, now: int | None = None) -> dict[str, Any]:
    """Check one record against its kind's fields; returns it unchanged."""
    if not isinstance(record, dict):
        raise WireError("record is not an object", index, None)
    kind = record.get("kind")
    if not isinstance(kind, str) or kind not in FIELDS:  # a dict or list is not even hashable
        raise WireError(f"unknown kind {str(kind)[:100]!r}", index, "kind")
    if not record.keys() <= _ALLOWED[kind]:
        unknown = sorted(set(record) - _ALLOWED[kind])[0]
        raise WireError(f"unknown field for kind {kind}", index, _shown(unknown))
    for name, optional, fast_types, lo, hi, rule in _FIELD_SPECS[kind]:
        value = record.get(name)
        if value is None:
            if not optional:
                raise WireError("required field is missing", index, name)
            continue
        # The common values are decided here, inline (a call per field would cost more than the
        # test); anything else, the general path checks and names the problem of.
        value_type = type(value)
        if value_type in fast_types:
            if value_type is str:
                if len(value) <= hi and "\x00" not in value and (value.isascii() or not checks.lone_surrogate(value)):
                    continue
            elif value_type is bool or lo <= value <= hi:  # NaN compares false: the general path
                continue
        _check_field(value, rule, index, name)
    # The job id reaches file names, URLs and Slurm commands: only the forms jobsight takes.
    if kind not in NODE_KINDS and not is_job_id(record["job"]):
        raise WireError(NOT_A_JOB_ID, index, "job")
    now = now if now is not None else now_us()
    ts = record["ts"]
    if not MIN_TS_US <= ts <= now + FUTURE_SLACK_US:
        raise WireError("timestamp out of range (expects microseconds since the epoch)", index, "ts")
    if ts < now - MAX_RECORD_AGE_DAYS * _DAY_US:
        raise WireError(
            f"older than {MAX_RECORD_AGE_DAYS} days: the collector takes late records (a spool replayed "
            f"after an outage) up to {MAX_RECORD_AGE_DAYS} days old and keeps no partitions further back for them",
            index,
            "ts",
        )
    return record


def _column_fits(values: list[Any], optional: bool, fast_types: tuple[type, ...], lo: float, hi: float) -> bool:
    """Whether every value of one field, across the records of one kind, is one the per-record
    fast path takes (``False``: let the per-record path find and name the problem)."""
    types = set(map(type, values))
    if type(None) in types:
        if not optional:
            return False
        types.discard(type(None))
        values = [v for v in values if v is not None]
    if not values:
        return True
    if not types <= set(fast_types):
        return False
    if types == {bool}:
        return True
    if str in types:
        joined = "".join(values)
        return (max(map(len, values)) <= hi and "\x00" not in joined
                and (joined.isascii() or not checks.lone_surrogate(joined)))
    try:
        total = sum(values)  # NaN and infinities make it NaN or infinite; no bound is either
    except OverflowError:  # an integer too large for a float, in a float field
        return False
    return bool(total == total and abs(total) != float("inf") and lo <= min(values) and max(values) <= hi)


def _kind_fits(kind: str, records: list[dict[str, Any]], now: int, columns: dict[str, list[Any]]) -> bool:
    """The per-record checks of :func:`validate_record`, field by field over many records of
    one kind: the same verdict for a batch that passes, in builtins that run in C. The fields
    checked are left in ``columns``."""
    if not all(map(_ALLOWED[kind].issuperset, records)):  # every record's keys are allowed
        return False
    for name, optional, fast_types, lo, hi, _ in _FIELD_SPECS[kind]:
        if not fast_types:  # its content needs a check of its own: the per-record path
            return False
        column = list(map(dict.get, records, repeat(name)))
        if not _column_fits(column, optional, fast_types, lo, hi):
            return False
        columns[name] = column
    times: list[int] = list(map(dict.__getitem__, records, repeat("ts")))  # every "ts" is an int by now
    columns["ts"] = times
    first, last = min(times), max(times)
    jobs = columns.get("job")  # absent for a node's kinds; a batch holds few distinct ids, each checked once
    return ((jobs is None or all(map(is_job_id, set(jobs)))) and MIN_TS_US <= first
            and last <= now + FUTURE_SLACK_US and first >= now - MAX_RECORD_AGE_DAYS * _DAY_US)


def validate_records(records: list[Any], now: int) -> list[dict[str, Any]]:
    """Every record checked as :func:`validate_record` checks it; returns them unchanged.

    A node's batch is dozens of records of one or two kinds with the same fields, and checking
    them record by record, field by field, was most of the CPU the collector spent on a sample.
    So the records of each kind are checked a field at a time (types, bounds and characters of
    the whole column at once); a kind whose column check fails, or that has a field with a
    content check, is checked record by record, which raises the error naming the first bad
    record and field, as it always did."""
    return validate_columns(records, now)[0]


def _by_kind(records: list[Any]) -> dict[str, list[dict[str, Any]]] | None:
    """The records of each kind, in batch order; ``None`` when one is not a dict of a known kind."""
    if set(map(type, records)) - {dict}:
        return None
    kinds: list[Any] = list(map(dict.get, records, repeat("kind")))
    if set(map(type, kinds)) - {str}:
        return None
    found = set(kinds)
    if not found <= FIELDS.keys():
        return None
    if len(found) == 1:
        return {kinds[0]: records}
    return {kind: list(compress(records, map(kind.__eq__, kinds))) for kind in sorted(found, key=kinds.index)}


def validate_columns(records: list[Any], now: int) -> tuple[list[dict[str, Any]], Columns | None]:
    """:func:`validate_records`, with the columns the field-at-a-time check made (``None``
    when the records were checked one by one)."""
    by_kind = _by_kind(records)
    if by_kind is None:
        return [validate_record(record, index, now) for index, record in enumerate(records)], None
    columns: Columns = {kind: {} for kind in by_kind}
    if all(_kind_fits(kind, same, now, columns[kind]) for kind, same in by_kind.items()):
        return records, columns
    return [validate_record(record, index, now) for index, record in enumerate(records)], None


def _days(records: list[dict[str, Any]], columns: Columns | None) -> set[int]:
    """The UTC days of the records' times; only the first and last when those are at most
    ``MAX_BATCH_DAYS`` apart (all a batch may span), as they almost always are."""
    if columns and records:
        first = min(min(of_kind["ts"]) for of_kind in columns.values()) // _DAY_US
        last = max(max(of_kind["ts"]) for of_kind in columns.values()) // _DAY_US
        if last - first < MAX_BATCH_DAYS:
            return {first, last}
    return {record["ts"] // _DAY_US for record in records}


def decode_batch(body: bytes, now: int | None = None, loads: Callable[[bytes], Any] = loads_batch) -> Batch:
    """Parse and validate an already-decompressed batch body.

    ``loads`` parses the JSON; the collector passes a faster parser than the standard
    library's (the agent side must not depend on one)."""
    try:
        envelope = loads(body)
    except RecursionError as exc:
        # The standard library's parser recurses once per nested list or object.
        raise WireError("body is not valid JSON: nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"body is not valid JSON: {exc}") from exc
    if not isinstance(envelope, dict):
        raise WireError("body is not a JSON object")
    allowed = {"v", "source", "seq", "sent_at", "cluster", "records"}
    for name in envelope:
        if name not in allowed:
            raise WireError("unknown envelope field", None, _shown(name))
    if envelope.get("v") != VERSION:
        raise WireError(f"unsupported protocol version (this collector speaks {VERSION})", None, "v")
    source = envelope.get("source")
    if not isinstance(source, str) or not source:
        raise WireError("expected a non-empty string", None, "source")
    _check_string(source, 256, None, "source")
    seq = envelope.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**63:
        raise WireError("expected a non-negative integer", None, "seq")
    sent_at = envelope.get("sent_at", 0.0)
    if isinstance(sent_at, bool) or not isinstance(sent_at, (int, float)):
        raise WireError("expected a number", None, "sent_at")
    problem = checks.number_problem(sent_at, FINITE)  # 10**400 is an int no float holds
    if problem is not None:
        raise WireError(problem, None, "sent_at")
    cluster = envelope.get("cluster", "default")
    if not isinstance(cluster, str) or not cluster:
        raise WireError("expected a non-empty string", None, "cluster")
    _check_string(cluster, 128, None, "cluster")
    records = envelope.get("records")
    if not isinstance(records, list):
        raise WireError("expected a list", None, "records")
    if len(records) > MAX_RECORDS:
        raise WireError(f"more than {MAX_RECORDS} records in one batch", None, "records")
    now = now if now is not None else now_us()
    checked, columns = validate_columns(records, now)
    days = _days(checked, columns)
    if len(days) > MAX_BATCH_DAYS:
        raise WireError(
            f"records on {len(days)} different UTC days: at most {MAX_BATCH_DAYS} in one batch (each day is a "
            "partition the collector may have to create; send records of other days in batches of their own)",
            None,
            "records",
        )
    return Batch(source, seq, float(sent_at), cluster, checked, columns)
