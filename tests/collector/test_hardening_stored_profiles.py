"""Profiles stored before ingest checked them (or by an older collector) must not break reads:
a trace that inflates without bound or is not gzip, a diagnosis that is not a list of hints."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post

MiB = 1024 * 1024


def _bomb(inflated_mib: int) -> bytes:
    """A gzip stream of ``inflated_mib`` MiB of zeros (about 1/1000 of that compressed),
    made a MiB at a time so the test never holds it inflated."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    parts = [deflater.compress(zeros) for _ in range(inflated_mib)]
    return b"".join(parts) + deflater.flush()


def _job(client: Any, job: str) -> None:
    log = {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": "hi"}
    assert post(client, gz([log])).status_code == 200


def _insert_profile(db: psycopg.Connection[Any], job: str, *, trace: bytes | None = None, diagnosis: Any = None,
                    rank: int | None = 0) -> int:
    row = db.execute(
        """INSERT INTO profiles (cluster, job_id, ts, rank, profile_id, summary, diagnosis, trace_gz)
           VALUES ('default', %s, now(), %s, 'stored-before', '{}'::jsonb, %s, %s) RETURNING id""",
        (job, rank, Jsonb(diagnosis) if diagnosis is not None else None, trace),
    ).fetchone()
    return int(row[0])


def test_a_trace_inflating_past_the_cap_is_422_and_still_downloads_as_stored(
    client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    from jobsight.collector.query.traces import MAX_TRACE_JSON_BYTES

    bomb = _bomb(MAX_TRACE_JSON_BYTES // MiB + 8)
    assert len(bomb) < MiB
    profile = _insert_profile(db, job_id, trace=bomb)
    tracemalloc.start()
    try:
        response = client.get(f"/v1/jobs/{job_id}/profiles/{profile}/trace", params={"format": "json"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 422, response.text[:300]
    assert "format=gz" in response.json()["detail"]["error"]
    # Inflated a chunk at a time and dropped: never the whole trace in memory.
    assert peak < 64 * MiB, f"peak {peak / MiB:.0f} MiB"
    stored = client.get(f"/v1/jobs/{job_id}/profiles/{profile}/trace")
    assert stored.status_code == 200 and stored.content == bomb


def test_a_trace_under_the_cap_is_served_inflated(client: Any, db: psycopg.Connection[Any], job_id: str) -> None:
    events = {"traceEvents": [{"name": "aten::mm", "ph": "X", "ts": i, "dur": 1} for i in range(50000)]}
    raw = json.dumps(events).encode()
    # Two gzip members, as gzip.decompress (and zcat) read them.
    profile = _insert_profile(db, job_id, trace=gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]))
    response = client.get(f"/v1/jobs/{job_id}/profiles/{profile}/trace", params={"format": "json"})
    assert response.status_code == 200, response.text[:300]
    assert response.content == raw
    assert response.headers["content-length"] == str(len(raw))
    assert response.headers["content-disposition"].endswith('.pt.trace.json"')


@pytest.mark.parametrize(
    "trace",
    [b"\x1f\x8b this is not gzip", gzip.compress(b'{"traceEvents": []}')[:-6],
     gzip.compress(b'{"traceEvents": []}') + b"junk"],
    ids=["magic-only", "truncated", "trailing-junk"],
)
def test_a_stored_trace_that_is_not_gzip_is_a_clear_422(
    client: Any, db: psycopg.Connection[Any], job_id: str, trace: bytes
) -> None:
    profile = _insert_profile(db, job_id, trace=trace)
    response = client.get(f"/v1/jobs/{job_id}/profiles/{profile}/trace", params={"format": "json"})
    assert response.status_code == 422, response.text
    assert "gzip" in response.json()["detail"]["error"]
    assert client.get(f"/v1/jobs/{job_id}/profiles/{profile}/trace").content == trace


@pytest.mark.parametrize(
    "diagnosis",
    [5, "input_bound", {"rule": "input_bound"}, [5, "x", None, [1]], [{"rule": ["not", "a", "string"]}],
     [{"rule": {"nested": True}}, {"no_rule": 1}], True],
    ids=["number", "string", "object", "list-of-scalars", "unhashable-rule", "object-rule", "bool"],
)
def test_a_stored_diagnosis_that_is_not_hints_is_skipped(
    client: Any, db: psycopg.Connection[Any], job_id: str, diagnosis: Any
) -> None:
    _job(client, job_id)
    _insert_profile(db, job_id, diagnosis=diagnosis, rank=0)
    _insert_profile(db, job_id, diagnosis=[{"rule": "from_rank_1", "message": "kept"}, 7], rank=1)
    response = client.get(f"/v1/jobs/{job_id}/diagnosis")
    assert response.status_code == 200, response.text
    hints = response.json()["hints"]
    assert [h["rule"] for h in hints if "source" in h] == ["from_rank_1"]
    assert client.get(f"/v1/jobs/{job_id}/profiles").status_code == 200
