"""The wire protocol between agents and the collector, shared by both sides.

A batch is gzip-compressed JSON::

    {"v": 1, "source": "node42:agent", "seq": 17, "sent_at": 1763769600.0,
     "cluster": "default", "records": [{"kind": "log", "job": "123", "ts": ..., ...}]}

``(source, seq)`` identifies a batch: the collector stores a batch once however
often it is sent. Every record carries ``kind``, ``job`` (the Slurm job id, or
``local-<host>-<pid>-<start>`` outside Slurm) and ``ts`` (microseconds since the
Unix epoch, UTC).

Each kind's fields are declared once, in :mod:`jobsight.protocol.records`; ``FIELDS``
is derived from there. Validation lives here, in the standard library only, because
the agent must import with nothing but the ``agent`` extra installed. The collector
runs the same checks and turns a :class:`WireError` into a 422 naming the record and
the field.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from types import UnionType
from typing import Annotated, Any, Final, Union, get_args, get_origin, get_type_hints

from jobsight.protocol.records import RECORDS, Common, WireSpec

VERSION: Final = 1
MAX_STRING: Final = 4096
MAX_MESSAGE: Final = 65536
MAX_RECORDS: Final = 20000
# Timestamps before this or more than a day ahead of the collector's clock are
# almost always unit mistakes (seconds or nanoseconds passed as microseconds).
MIN_TS_US: Final = 946684800 * 1_000_000  # 2000-01-01
FUTURE_SLACK_US: Final = 86400 * 1_000_000

_PLAIN_SPECS: Final[dict[Any, str]] = {str: "str", int: "int", float: "float", bool: "bool"}


def spec_of(hint: Any) -> str:
    """The wire spec of a field annotation in :mod:`jobsight.protocol.records`.

    ``str``, ``int``, ``float``, ``bool`` are specs of the same name; ``Annotated[..., WireSpec(s)]``
    (``records.Text``, ``records.Json``) is ``s``; ``list[str]`` and ``list[int]`` are ``"str_list"``
    and ``"int_list"``; ``X | None`` is the spec of ``X`` plus ``"?"`` (absent or null allowed).
    Anything else raises ``TypeError``, so a field the validator cannot check never loads."""
    optional = False
    if get_origin(hint) in (Union, UnionType):
        members = [arg for arg in get_args(hint) if arg is not type(None)]
        if len(members) != 1 or len(get_args(hint)) != 2:
            raise TypeError(f"no wire spec for {hint!r}: only X | None unions")
        optional, hint = True, members[0]
    if get_origin(hint) is Annotated:
        marks = [mark for mark in hint.__metadata__ if isinstance(mark, WireSpec)]
        if len(marks) != 1:
            raise TypeError(f"no wire spec for {hint!r}: expected one WireSpec")
        spec = marks[0].spec
    elif get_origin(hint) is list and get_args(hint) in ((str,), (int,)):
        spec = f"{_PLAIN_SPECS[get_args(hint)[0]]}_list"
    elif hint in _PLAIN_SPECS:
        spec = _PLAIN_SPECS[hint]
    else:
        raise TypeError(f"no wire spec for {hint!r}")
    return f"{spec}?" if optional else spec


def wire_fields(shape: type[Any]) -> dict[str, str]:
    """A records dataclass's fields as ``{name: spec}``, in declaration order."""
    hints = get_type_hints(shape, include_extras=True)
    return {f.name: spec_of(hints[f.name]) for f in dataclass_fields(shape)}


# Field specs by kind, derived from jobsight.protocol.records, the one declaration of each
# kind's shape (add or change a field there, not here): "str", "text" (long string), "int",
# "float", "bool", "json" (any JSON-safe value), "int_list", "str_list"; a trailing "?"
# means the field may be absent or null. Key order is declaration order, which is the order
# fields are checked in.
KINDS: Final[tuple[str, ...]] = tuple(RECORDS)
_COMMON: Final = wire_fields(Common)
FIELDS: Final[dict[str, dict[str, str]]] = {kind: wire_fields(shape) for kind, shape in RECORDS.items()}

# The profile trace is a gzip blob in base64; it has its own, larger cap.
MAX_TRACE_B64: Final = 16 * 1024 * 1024


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


@dataclass(frozen=True)
class Batch:
    source: str
    seq: int
    sent_at: float
    cluster: str
    records: list[dict[str, Any]]


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
    body = json.dumps(envelope, separators=(",", ":"), allow_nan=False).encode()
    return gzip.compress(body, compresslevel=5)


def loads_batch(raw: bytes) -> Any:
    """Parse JSON. NaN and Infinity parse (as Python's json does) so that validation can
    name the record and field that holds them, rather than failing the whole body."""
    return json.loads(raw)


def _check_string(value: str, limit: int, index: int | None, field: str) -> None:
    if "\x00" in value:
        raise WireError("NUL character in string", index, field)
    if len(value) > limit:
        raise WireError(f"string longer than {limit} characters", index, field)


def _check_json_value(value: Any, index: int, field: str, depth: int = 0) -> None:
    if depth > 16:
        raise WireError("JSON nested too deeply", index, field)
    if isinstance(value, str):
        _check_string(value, MAX_MESSAGE, index, field)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise WireError("NaN or Infinity", index, field)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_string(str(key), MAX_STRING, index, field)
            _check_json_value(item, index, field, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json_value(item, index, field, depth + 1)


def _check_field(value: Any, spec: str, index: int, field: str) -> None:
    kind = spec.rstrip("?")
    if value is None:
        if not spec.endswith("?"):
            raise WireError("required field is null", index, field)
        return
    if kind in ("str", "text"):
        if not isinstance(value, str):
            raise WireError("expected a string", index, field)
        limit = MAX_STRING if kind == "str" else MAX_MESSAGE
        if field == "trace_gz_b64":
            limit = MAX_TRACE_B64
        _check_string(value, limit, index, field)
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError("expected an integer", index, field)
        if not -(2**63) <= value < 2**63:
            raise WireError("integer out of range", index, field)
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError("expected a number", index, field)
        if not math.isfinite(value):
            raise WireError("NaN or Infinity", index, field)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise WireError("expected true or false", index, field)
    elif kind in ("str_list", "int_list"):
        if not isinstance(value, list) or len(value) > 4096:
            raise WireError("expected a list", index, field)
        for item in value:
            _check_field(item, kind.removesuffix("_list"), index, field)
    elif kind == "json":
        _check_json_value(value, index, field)


_FAST_TYPES: Final[dict[str, tuple[type, ...]]] = {"float": (float, int), "int": (int,), "str": (str,), "bool": (bool,)}
_FIELD_SPECS: Final = {
    kind: tuple(
        (name, spec.rstrip("?"), spec.endswith("?"), _FAST_TYPES.get(spec.rstrip("?"), ()))
        for name, spec in (*_COMMON.items(), *fields.items())
    )
    for kind, fields in FIELDS.items()
}
_ALLOWED: Final = {kind: frozenset(fields) | frozenset(_COMMON) for kind, fields in FIELDS.items()}
_INT64: Final = range(-(2**63), 2**63)


def _plainly_valid(value: Any, value_type: type) -> bool:
    """The common cases, decided without the general path (which gives the error message)."""
    if value_type is float:
        return math.isfinite(value)
    if value_type is int:
        return value in _INT64
    if value_type is str:
        return len(value) <= MAX_STRING and "\x00" not in value
    return True


def validate_record(record: Any, index: int, now: int | None = None) -> dict[str, Any]:
    """Check one record against its kind's fields; returns it unchanged."""
    if not isinstance(record, dict):
        raise WireError("record is not an object", index, None)
    kind = record.get("kind")
    if kind not in FIELDS:
        raise WireError(f"unknown kind {kind!r}", index, "kind")
    if not record.keys() <= _ALLOWED[kind]:
        unknown = sorted(set(record) - _ALLOWED[kind])[0]
        raise WireError(f"unknown field for kind {kind}", index, unknown)
    for name, field_kind, optional, fast_types in _FIELD_SPECS[kind]:
        value = record.get(name)
        if value is None:
            if not optional:
                raise WireError("required field is missing", index, name)
            continue
        value_type = type(value)
        if value_type not in fast_types or not _plainly_valid(value, value_type):
            _check_field(value, field_kind, index, name)
    if not record["job"]:
        raise WireError("empty job id", index, "job")
    now = now if now is not None else now_us()
    if not MIN_TS_US <= record["ts"] <= now + FUTURE_SLACK_US:
        raise WireError("timestamp out of range (expects microseconds since the epoch)", index, "ts")
    return record


def decode_batch(body: bytes, now: int | None = None, loads: Callable[[bytes], Any] = loads_batch) -> Batch:
    """Parse and validate an already-decompressed batch body.

    ``loads`` parses the JSON; the collector passes a faster parser than the standard
    library's (the agent side must not depend on one)."""
    try:
        envelope = loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"body is not valid JSON: {exc}") from exc
    if not isinstance(envelope, dict):
        raise WireError("body is not a JSON object")
    allowed = {"v", "source", "seq", "sent_at", "cluster", "records"}
    for name in envelope:
        if name not in allowed:
            raise WireError("unknown envelope field", None, name)
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
    if isinstance(sent_at, bool) or not isinstance(sent_at, (int, float)) or not math.isfinite(sent_at):
        raise WireError("expected a number", None, "sent_at")
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
    checked = [validate_record(record, index, now) for index, record in enumerate(records)]
    return Batch(source, seq, float(sent_at), cluster, checked)
