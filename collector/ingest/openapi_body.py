"""The OpenAPI request body of ``POST /v1/ingest``, derived from the wire protocol.

The route reads its raw body itself (gzip or plain JSON, inflated in a worker thread), so
FastAPI cannot infer a schema from it; without one, fuzzers and client generators never
reach the route. Each record kind is one schema built from ``wire.FIELDS`` (itself from
``protocol/records.py``), so the schema follows the records without being written twice.
It describes shapes and length caps; what depends on the collector's clock (``ts`` within
range) stays the validator's, so every batch the collector stores validates here.
"""

from __future__ import annotations

from typing import Any, Final

from jobsight.protocol.slurm_ids import SAFE_JOB
from jobsight.protocol.wire import COMMON_FIELDS, FIELDS, MAX_MESSAGE, MAX_RECORDS, MAX_STRING, MAX_TRACE_B64, VERSION

_INT64: Final = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
_LONGER: Final[dict[str, int]] = {"trace_gz_b64": MAX_TRACE_B64}


def _field_schema(name: str, spec: str) -> dict[str, Any]:
    kind = spec.rstrip("?")
    schema: dict[str, Any]
    if kind in ("str", "text"):
        limit = _LONGER.get(name, MAX_STRING if kind == "str" else MAX_MESSAGE)
        schema = {"type": "string", "maxLength": limit}
    elif kind == "int":
        schema = dict(_INT64)
    elif kind == "float":
        schema = {"type": "number"}
    elif kind == "bool":
        schema = {"type": "boolean"}
    elif kind == "str_list":
        schema = {"type": "array", "maxItems": 4096, "items": {"type": "string", "maxLength": MAX_STRING}}
    elif kind == "int_list":
        schema = {"type": "array", "maxItems": 4096, "items": dict(_INT64)}
    else:  # "json": any JSON value
        return {}
    if spec.endswith("?"):
        schema["type"] = [schema["type"], "null"]
    return schema


def record_schema(kind: str) -> dict[str, Any]:
    """One record kind: its fields, which of them are required, nothing else allowed."""
    fields = {**COMMON_FIELDS[kind], **FIELDS[kind]}
    properties = {name: _field_schema(name, spec) for name, spec in fields.items()}
    properties["kind"] = {"type": "string", "enum": [kind]}
    if "job" in properties:  # a node's kinds have none
        properties["job"] = {"type": "string", "pattern": f"^{SAFE_JOB.pattern}$", "maxLength": 128}
    properties["ts"] = {"type": "integer", "description": "microseconds since the Unix epoch, UTC"}
    return {
        "title": kind,
        "type": "object",
        "properties": properties,
        "required": [name for name, spec in fields.items() if not spec.endswith("?")],
        "additionalProperties": False,
    }


def batch_schema() -> dict[str, Any]:
    """The batch envelope."""
    return {
        "title": "Batch",
        "type": "object",
        "properties": {
            "v": {"type": "integer", "enum": [VERSION]},
            "source": {"type": "string", "minLength": 1, "maxLength": 256},
            "seq": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
            "sent_at": {"type": "number"},
            "cluster": {"type": "string", "minLength": 1, "maxLength": 128},
            "records": {
                "type": "array",
                "maxItems": MAX_RECORDS,
                "items": {"oneOf": [record_schema(kind) for kind in FIELDS]},
            },
        },
        "required": ["v", "source", "seq", "records"],
        "additionalProperties": False,
    }


INGEST_OPENAPI: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "description": "One batch, gzip-compressed (``Content-Encoding: gzip``) or plain JSON.",
        "content": {"application/json": {"schema": batch_schema()}},
    }
}
"""``openapi_extra`` of the ingest route."""
