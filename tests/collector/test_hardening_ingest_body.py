"""The ingest body as a whole: one gzip member and nothing after it, limits that mean
"smaller than", and a request body in the OpenAPI schema that valid batches satisfy."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.protocol.wire import encode_batch, now_us
from tests.collector.helpers import gz, next_seq, one_of_each, post


def _log(job: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": "ok", **extra}


def _stored(db: psycopg.Connection[Any], job: str) -> int:
    return int(db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job,)).fetchone()[0])


@pytest.mark.parametrize(
    ("tail", "words"),
    [
        (lambda job: gzip.compress(json.dumps({"v": 1}).encode()), "second gzip member"),
        (lambda job: gz([_log(job + "-smuggled")]), "second gzip member"),
        (lambda job: b"trailing garbage", "trailing data"),
        (lambda job: b"\x00", "trailing data"),
    ],
    ids=["second-member", "second-batch", "garbage", "one-zero-byte"],
)
def test_anything_after_the_gzip_stream_is_refused(
    client: Any, db: psycopg.Connection[Any], job_id: str, tail: Any, words: str
) -> None:
    response = post(client, gz([_log(job_id)]) + tail(job_id))
    assert response.status_code == 400, response.text
    assert words in response.json()["detail"]["error"]
    assert _stored(db, job_id) == 0 and _stored(db, job_id + "-smuggled") == 0


@pytest.fixture
def small_client(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    settings = load_collector_settings(
        database_url=database_url, data_dir=data_dir, max_body_bytes=4096, max_decompressed_bytes=65536
    )
    with TestClient(create_app(settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {admin_token}"
        yield test_client


def _envelope(job: str, message_len: int) -> bytes:
    return json.dumps({"v": 1, "source": "limits", "seq": next_seq(),
                       "records": [_log(job, message="x" * message_len)]}).encode()


def _plain_of_size(job: str, size: int) -> bytes:
    """A plain JSON batch of exactly ``size`` bytes."""
    probe = _envelope(job, 0)
    body = _envelope(job, size - len(probe))
    assert len(body) == size
    return body


def test_a_body_of_exactly_the_limit_is_413_one_byte_less_is_stored(
    small_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    # max_body_bytes: the wire size (plain JSON, so no decompression is involved).
    at_limit = _plain_of_size(job_id, 4096)
    response = small_client.post("/v1/ingest", content=at_limit)
    assert response.status_code == 413, response.text
    assert "4096" in response.json()["detail"]["error"]
    under = _plain_of_size(job_id, 4095)
    assert small_client.post("/v1/ingest", content=under).status_code == 200
    assert _stored(db, job_id) == 1


def test_a_body_inflating_to_exactly_the_limit_is_413_one_byte_less_is_stored(
    small_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    # max_decompressed_bytes: what the gzip body inflates to.
    at_limit = gzip.compress(_plain_of_size(job_id, 65536))
    assert len(at_limit) < 4096
    response = post(small_client, at_limit)
    assert response.status_code == 413, response.text
    assert "decompress" in response.json()["detail"]["error"]
    assert post(small_client, gzip.compress(_plain_of_size(job_id, 65535))).status_code == 200
    assert _stored(db, job_id) == 1


def test_a_truncated_gzip_is_still_400(client: Any, job_id: str) -> None:
    body = gz([_log(job_id)])
    response = post(client, body[:-4])
    assert response.status_code == 400 and "truncated" in response.json()["detail"]["error"]
    raw_deflate = zlib.compress(b"{}")[2:]
    assert post(client, b"\x1f\x8b" + raw_deflate).status_code == 400


def test_the_openapi_schema_describes_the_ingest_body(client: Any, job_id: str) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (schemathesis's dependency) is not installed")
    operation = client.get("/openapi.json").json()["paths"]["/v1/ingest"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert operation["requestBody"]["required"] is True
    assert set(schema["required"]) == {"v", "source", "seq", "records"}
    kinds = {item["properties"]["kind"]["enum"][0] for item in schema["properties"]["records"]["items"]["oneOf"]}
    assert kinds == {"gpu_sample", "host_sample", "log", "metric", "step", "profile", "job_started", "job_ended",
                     "dropped", "gpu_event", "gpu_unallocated_use"}
    # Every kind, every optional field filled, as the agent sends them: valid against the schema.
    batch = json.loads(gzip.decompress(encode_batch("schema", next_seq(), one_of_each(job_id))))
    jsonschema.Draft202012Validator(schema).validate(batch)
    # And what the collector refuses for its shape, the schema refuses too.
    broken = {**batch, "records": [{**batch["records"][0], "colour": "red"}]}
    assert not jsonschema.Draft202012Validator(schema).is_valid(broken)
    # A job id that is not one (an option for a Slurm command), the schema refuses as the collector does.
    forged = {**batch, "records": [{**batch["records"][0], "job": "--user=alice"}]}
    assert not jsonschema.Draft202012Validator(schema).is_valid(forged)
    # A node's record names no job, and must name its node.
    use = {"kind": "gpu_unallocated_use", "ts": now_us(), "node": "n1", "gpu_index": 3, "gpu_uuid": "GPU-3", "pid": 7}
    jsonschema.Draft202012Validator(schema).validate({**batch, "records": [use]})
    for wrong in ({**use, "job": job_id}, {k: v for k, v in use.items() if k != "node"}):
        assert not jsonschema.Draft202012Validator(schema).is_valid({**batch, "records": [wrong]})
    assert post(client, gzip.compress(json.dumps(batch).encode())).status_code == 200
