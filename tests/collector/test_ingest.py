"""POST /v1/ingest against the real database: round trips, idempotency, bad input."""

from __future__ import annotations

import base64
import gzip
import json
import os
from typing import Any

import psycopg
import pytest

from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, next_seq, one_of_each, post, raw_gz

TABLES = ("gpu_samples", "gpu_events", "host_samples", "log_events", "metrics", "steps", "profiles")


def counts(db: psycopg.Connection[Any], job: str) -> dict[str, int]:
    return {t: db.execute(f"SELECT count(*) FROM {t} WHERE job_id = %s", (job,)).fetchone()[0] for t in TABLES}


def test_each_record_kind_round_trips(client: Any, db: psycopg.Connection[Any], job_id: str) -> None:
    records = one_of_each(job_id)
    response = post(client, gz(records))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "stored"

    gpu = db.execute(
        "SELECT node, gpu_index, gpu_uuid, gpu_name, util_gpu, util_mem, mem_used, mem_total, power_w, energy_j,"
        " temp_c, sm_clock_mhz, mem_clock_mhz, pcie_tx_kbs, pcie_rx_kbs, throttle_reasons, ecc_errors,"
        " process_count, sm_active, tensor_active, lost, (extract(epoch from ts) * 1e6)::bigint,"
        " nvlink_crc_errors, nvlink_replay_errors, nvlink_recovery_errors, pcie_replays, remapped_rows_pending,"
        " remap_failure, retired_pages_pending"
        " FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchall()
    sent = records[1]
    assert gpu == [(
        "n1", 0, "GPU-aaa", "NVIDIA H100", 87.0, 40.0, 40 * 2**30, 80 * 2**30, 512.5, 123456.5, 61.0, 1980, 2619,
        1200, 3400, 4, 0, 1, 0.8, 0.5, False, sent["ts"], 12, 3, 1, 2**32 - 1, True, False, False,
    )]
    events = db.execute("SELECT node, gpu_index, gpu_uuid, event, code, (extract(epoch from ts) * 1e6)::bigint"
                        " FROM gpu_events WHERE job_id = %s", (job_id,)).fetchall()
    assert events == [("n1", 0, "GPU-aaa", "xid", 79, sent["ts"])]
    host = db.execute("SELECT cpu_util, cpu_time_s, mem_used, mem_limit FROM host_samples WHERE job_id = %s",
                      (job_id,)).fetchall()
    assert host == [(350.0, 12.5, 2**33, 2**35)]
    logs = db.execute(
        "SELECT rank, pid, tid, thread, level, logger, message, exception, attrs FROM log_events"
        " WHERE job_id = %s ORDER BY ts", (job_id,)).fetchall()
    assert logs[0] == (0, 4242, 4243, "MainThread", "ERROR", "train", "loss is nan",
                       "Traceback ...\nValueError: nan", {"step": 7, "lr": 0.001})
    # A dropped record becomes a warning in the job's log, with the count.
    assert logs[1][4] == "WARNING" and logs[1][8] == {"dropped": 12, "reason": "spool full"}
    assert db.execute("SELECT rank, tid, step, name, value FROM metrics WHERE job_id = %s",
                      (job_id,)).fetchall() == [(0, 4243, 7, "loss", 2.5)]
    assert db.execute(
        "SELECT tid, step, epoch, phase, duration_s, data_wait_s, compute_s, samples FROM steps WHERE job_id = %s",
        (job_id,)).fetchall() == [(4243, 7, 1, "train", 0.021, 0.004, 0.017, 32)]
    profile = db.execute("SELECT profile_id, step_start, step_end, summary, diagnosis, trace_gz FROM profiles"
                         " WHERE job_id = %s", (job_id,)).fetchone()
    assert profile[:5] == ("p1", 5, 8, {"top_ops": [{"name": "aten::mm"}]}, [{"rule": "input_bound"}])
    assert json.loads(gzip.decompress(profile[5])) == {"traceEvents": []}
    job = db.execute("SELECT user_name, uid, account, partition, name, nodes, gpus, time_limit_s, state, exit_code,"
                     " end_time IS NOT NULL FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert job == ("alice", 1001, "ml", "gpu", "train", ["n1"], ["n1:0", "n1:1"], 3600, "completed", 0, True)


def test_replayed_batch_is_stored_once(client: Any, db: psycopg.Connection[Any], job_id: str) -> None:
    body = gz(one_of_each(job_id), source="replay-source", seq=42)
    first, second = post(client, body), post(client, body)
    assert first.json()["status"] == "stored"
    assert second.status_code == 200 and second.json()["status"] == "duplicate"
    assert counts(db, job_id) == {t: 1 for t in TABLES} | {"log_events": 2}


def test_unknown_job_is_created(client: Any, db: psycopg.Connection[Any]) -> None:
    job = "local-workstation-4242-1763769600"
    ts = now_us()
    assert post(client, gz([{"kind": "metric", "job": job, "ts": ts, "name": "loss", "value": 1.0}])).status_code == 200
    row = db.execute("SELECT state, (extract(epoch from start_time) * 1e6)::bigint FROM jobs WHERE job_id = %s",
                     (job,)).fetchone()
    assert row == ("running", ts)


def _log(job: str, **overrides: Any) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": "ok", **overrides}


def _with_raw_record_field(job: str, field: str, raw: str) -> bytes:
    """A batch whose second record has ``field`` set to a raw JSON token (e.g. NaN)."""
    good = _log(job)
    text = json.dumps({"v": 1, "source": "bad", "seq": next_seq(), "records": [good, _log(job)]})
    marker = '"message": "ok"}]'
    return gzip.compress(text.replace(marker, f'"message": "ok", "{field}": {raw}}}]').encode())


@pytest.mark.parametrize(
    ("make_body", "status", "record", "field"),
    [
        (lambda job: b"this is not gzip", 400, None, None),
        (lambda job: gzip.compress(b"{not json"), 400, None, None),
        (lambda job: gzip.compress(b"[1, 2]"), 400, None, None),
        (lambda job: raw_gz({"v": 1, "source": "s", "seq": 1, "records": [_log(job), {**_log(job), "kind": "nope"}]}),
         422, 1, "kind"),
        (lambda job: raw_gz({"v": 1, "source": "s", "seq": 1, "records": [_log(job), _log(job, colour="red")]}),
         422, 1, "colour"),
        (lambda job: raw_gz({"v": 1, "source": "s", "seq": 1, "records": [_log(job), _log(job, pid="12")]}),
         422, 1, "pid"),
        (lambda job: _with_raw_record_field(job, "attrs", '{"x": NaN}'), 422, 1, "attrs"),
        (lambda job: _with_raw_record_field(job, "pid", "Infinity"), 422, 1, "pid"),
        (lambda job: raw_gz({"v": 1, "source": "s", "seq": 1,
                             "records": [_log(job), _log(job, message="a\u0000b")]}), 422, 1, "message"),
        (lambda job: raw_gz({"v": 1, "source": "s", "seq": 1,
                             "records": [_log(job), _log(job, logger="x" * 5000)]}), 422, 1, "logger"),
        (lambda job: raw_gz({"v": 1, "source": "s", "seq": 1,
                             "records": [_log(job), _log(job, ts=now_us() // 1000)]}), 422, 1, "ts"),
        (lambda job: raw_gz({"v": 1, "source": "s", "seq": 1,
                             "records": [_log(job), _log(job, ts=now_us() * 1000)]}), 422, 1, "ts"),
        (lambda job: raw_gz({"v": 1, "source": "s", "seq": 1, "records": [
            {"kind": "profile", "job": job, "ts": now_us(), "profile_id": "p", "summary": {},
             "trace_gz_b64": "!!!"}]}), 422, 0, "trace_gz_b64"),
        (lambda job: raw_gz({"v": 2, "source": "s", "seq": 1, "records": []}), 422, None, "v"),
    ],
    ids=["broken-gzip", "broken-json", "not-an-object", "unknown-kind", "unknown-field", "wrong-type",
         "nan", "infinity", "nul-character", "over-long-string", "timestamp-in-ms", "timestamp-in-ns", "bad-base64",
         "wrong-version"],
)
def test_bad_input_is_refused_and_stores_nothing(
    client: Any, db: psycopg.Connection[Any], job_id: str, make_body: Any, status: int, record: Any, field: Any
) -> None:
    response = post(client, make_body(job_id))
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert detail["error"]
    if status == 422 and field is not None:
        assert (detail["record"], detail["field"]) == (record, field)
    assert counts(db, job_id) == {t: 0 for t in TABLES}
    assert db.execute("SELECT count(*) FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0] == 0


def test_body_over_limit_is_413_before_and_after_decompression(
    database_url: str, data_dir: Any, admin_token: str, db: psycopg.Connection[Any], job_id: str
) -> None:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    settings = load_collector_settings(
        database_url=database_url, data_dir=data_dir, max_body_bytes=4096, max_decompressed_bytes=65536
    )
    with TestClient(create_app(settings)) as small:
        small.headers["Authorization"] = f"Bearer {admin_token}"
        # Incompressible: over the limit on the wire.
        noisy = [_log(job_id, message=base64.b64encode(os.urandom(2048)).decode()) for _ in range(4)]
        assert post(small, gz(noisy)).status_code == 413
        # Compresses well under 4 KiB but inflates past 64 KiB: a small bomb.
        bomb = [_log(job_id, message="a" * 60000), _log(job_id, message="b" * 60000)]
        body = gz(bomb)
        assert len(body) < 4096
        response = post(small, body)
        assert response.status_code == 413 and "decompress" in response.json()["detail"]["error"]
    assert counts(db, job_id)["log_events"] == 0


def test_token_is_required(client: Any, job_id: str) -> None:
    body = gz([_log(job_id)])
    assert client.post("/v1/ingest", content=body, headers={"Authorization": ""}).status_code == 401
    assert client.post("/v1/ingest", content=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_prometheus_metrics_count_records_and_rejects(client: Any, job_id: str) -> None:
    post(client, gz([_log(job_id), _log(job_id)]))
    post(client, b"garbage")
    text = client.get("/metrics").text
    assert 'jobsight_records_ingested_total{kind="log"} 2.0' in text
    assert 'jobsight_ingest_rejects_total{reason="bad_body"} 1.0' in text
    assert "jobsight_ingest_batch_seconds_bucket" in text


def test_the_prologs_start_is_the_jobs_start(client: Any, db: psycopg.Connection[Any], job_id: str) -> None:
    def start_us(job: str) -> int:
        row = db.execute("SELECT (extract(epoch from start_time) * 1e6)::bigint FROM jobs WHERE job_id = %s",
                         (job,)).fetchone()
        return int(row[0])

    t = now_us() - 3600 * 1_000_000
    prolog = {"kind": "job_started", "job": job_id, "ts": t, "node": "n1", "user": "alice"}
    metric = {"kind": "metric", "job": job_id, "name": "loss", "value": 1.0}
    # Records that arrive before the prolog's (a spool replayed after an outage) do not set the start.
    assert post(client, gz([{**metric, "ts": t - 600_000_000}])).status_code == 200
    assert post(client, gz([prolog])).status_code == 200
    assert start_us(job_id) == t
    # Nor do later records with an earlier clock, nor run metadata from the training process.
    assert post(client, gz([{**metric, "ts": t - 900_000_000},
                            {"kind": "job_started", "job": job_id, "ts": t - 900_000_000, "attrs": {"lr": 1}}]
                       )).status_code == 200
    assert start_us(job_id) == t
    # Another node's prolog a little earlier: the job started when its first node did.
    assert post(client, gz([{**prolog, "node": "n2", "ts": t - 2_000_000}])).status_code == 200
    assert start_us(job_id) == t - 2_000_000

    # A workstation run has no prolog: it starts at its earliest record, whatever the order.
    local = f"local-{job_id}"
    assert post(client, gz([{**metric, "job": local, "ts": t}])).status_code == 200
    assert post(client, gz([{**metric, "job": local, "ts": t - 5_000_000}])).status_code == 200
    assert start_us(local) == t - 5_000_000
