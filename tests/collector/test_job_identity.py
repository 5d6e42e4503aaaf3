"""A job's identity at the collector (issue #40): what names a job, and what a node's batch loses.

* The wire takes only job ids of jobsight's forms: ``--user=alice`` is refused where it enters (422
  naming the record and the field ``job``), before any table, and so before any Slurm command.
* A node token's batch with a record the node may not write (a job registered on another node) is
  stored without it, answered 200 with the refusal, counted and logged: the node's other jobs keep
  their telemetry. Job and admin tokens keep their all-or-nothing answers.
* A job token cannot rename a job a prolog registered, nor make it a demo; a run no prolog
  registered names itself until its prolog's record arrives, which replaces both.
* A GPU used outside any job is a node's record, without a job: the node's token writes it, a job
  token cannot, and only admins read it (``GET /v1/unallocated-gpu-uses``).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from jobsight.protocol.tokens import mint_job_token, mint_node_token
from jobsight.protocol.wire import encode_batch, now_us
from tests.collector.helpers import SECRET, next_seq, post


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def node_token(node: str) -> dict[str, str]:
    return bearer(mint_node_token(SECRET, "default", node))


def send(client: Any, records: list[dict[str, Any]], headers: dict[str, str], seq: int | None = None) -> Any:
    return post(client, encode_batch("identity-test", next_seq() if seq is None else seq, records), **headers)


def prolog(job: str, node: str, name: str = "train") -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": now_us(), "node": node, "user": "alice", "uid": 1001,
            "nodes": [node], "gpus": ["0"], "name": name}


def sample(job: str, node: str, util: float = 50.0) -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": job, "ts": now_us(), "node": node, "gpu_index": 0, "gpu_uuid": "GPU-i",
            "util_gpu": util}


def use(node: str, pid: int = 4321, gpu_index: int = 3) -> dict[str, Any]:
    return {"kind": "gpu_unallocated_use", "ts": now_us(), "node": node, "gpu_index": gpu_index,
            "gpu_uuid": f"GPU-{gpu_index}", "pid": pid, "uid": 2002, "mem_used": 1 << 30}


def log(job: str, message: str = "hello") -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": message}


@pytest.mark.parametrize("job", ["--user=alice", "-1", "", "a b", "../etc/passwd", "x" * 129, "4242;", "42\n43"])
def test_the_wire_refuses_what_is_not_a_job_id(client: Any, db: psycopg.Connection[Any], job: str,
                                               job_id: str) -> None:
    response = post(client, encode_batch("identity-test", next_seq(), [log(job_id), log(job)]))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert (detail["record"], detail["field"]) == (1, "job") and "not a job id" in detail["error"]
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM jobs WHERE job_id = %s", (job,)).fetchone()[0] == 0


@pytest.mark.parametrize("form", ["{}", "{}_7", "{}+1", "local-host-{}-1700000000"])
def test_the_wire_takes_slurms_forms_and_the_local_one(client: Any, job_id: str, form: str) -> None:
    number = str(int(job_id.rsplit("-", 1)[-1], 16) % 10**9)
    response = post(client, encode_batch("identity-test", next_seq(), [log(form.format(number))]))
    assert response.status_code == 200, response.text


def test_a_nodes_batch_with_a_record_of_a_job_registered_elsewhere_stores_the_rest(
    secret_client: Any, db: psycopg.Connection[Any], job_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    mine, elsewhere = f"{job_id}-mine", f"{job_id}-elsewhere"
    assert send(secret_client, [prolog(elsewhere, "n1")], node_token("n1")).status_code == 200
    assert send(secret_client, [prolog(mine, "n2")], node_token("n2")).status_code == 200
    seq = next_seq()
    batch = [sample(mine, "n2", 10.0), sample(elsewhere, "n2", 99.0), log(mine), use("n2")]
    with caplog.at_level(logging.WARNING, logger="jobsight.collector"):
        response = send(secret_client, batch, node_token("n2"), seq)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["status"], answer["records"]) == ("stored", 3)
    [refusal] = answer["refused"]
    assert refusal["index"] == 1 and f"job {elsewhere} is not registered on node n2" in refusal["reason"]
    # The rest is stored, rollups included; nothing of the refused record, in any table.
    assert db.execute("SELECT job_id, util_gpu FROM gpu_samples WHERE job_id = ANY(%s)",
                      ([mine, elsewhere],)).fetchall() == [(mine, 10.0)]
    assert db.execute("SELECT job_id FROM gpu_minutes WHERE job_id = ANY(%s)", ([mine, elsewhere],)).fetchall() == [
        (mine,)]
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (mine,)).fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM gpu_unallocated_uses WHERE node = 'n2' AND pid = 4321"
                      ).fetchone()[0] == 1
    assert db.execute("SELECT ingest.records FROM ingest_batches ingest WHERE source = 'identity-test' AND seq = %s",
                      (seq,)).fetchone()[0] == 3
    # Counted for the collector's own metrics, and logged for the admins.
    metrics = secret_client.get("/metrics").text
    assert 'jobsight_ingest_records_refused_total{kind="gpu_sample",rule="not_allocated"} 1.0' in metrics
    assert any("refused" in r.getMessage() and "node:default/n2" in r.getMessage() for r in caplog.records)
    # A replay is a duplicate, still naming what it would refuse; nothing is stored twice.
    again = send(secret_client, batch, node_token("n2"), seq).json()
    assert (again["status"], [r["index"] for r in again["refused"]]) == ("duplicate", [1])
    assert db.execute("SELECT count(*) FROM gpu_samples WHERE job_id = %s", (mine,)).fetchone()[0] == 1


def test_a_job_tokens_batch_is_still_refused_whole(secret_client: Any, db: psycopg.Connection[Any],
                                                   job_id: str) -> None:
    token = bearer(mint_job_token(SECRET, "default", job_id, 3600))
    response = send(secret_client, [log(job_id), log(f"{job_id}-other")], token)
    assert response.status_code == 403 and "record 1" in response.json()["detail"]["error"]
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 0


def test_a_job_token_cannot_rename_a_registered_job_or_make_it_a_demo(
    secret_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    token = bearer(mint_job_token(SECRET, "default", job_id, 3600, uid=1001))

    def row() -> tuple[Any, ...]:
        return tuple(db.execute("SELECT name, demo, attrs FROM jobs WHERE job_id = %s", (job_id,)).fetchone())

    def run(**fields: Any) -> dict[str, Any]:
        return {"kind": "job_started", "job": job_id, "ts": now_us(), "node": "n1", **fields}

    # Not registered yet (its prolog's record may still sit in a spool): the run names itself...
    assert send(secret_client, [run(name="jupyter-notebook", demo=True)], token).status_code == 200
    assert row()[:2] == ("jupyter-notebook", True)
    # ...until the prolog's record arrives: Slurm's name, and no demo.
    assert send(secret_client, [prolog(job_id, "n1", name="train")], node_token("n1")).status_code == 200
    assert row()[:2] == ("train", False)
    # After it, the run's own name and demo flag change neither; the batch (its logs) is stored.
    for field, value in (("name", "jupyter-notebook"), ("demo", True)):
        response = send(secret_client, [log(job_id), run(**{field: value})], token)
        assert response.status_code == 200, response.text
        assert row()[:2] == ("train", False)
    assert send(secret_client, [run(attrs={"lr": 0.1})], token).status_code == 200  # run metadata still
    assert row() == ("train", False, {"lr": 0.1})
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 2


def test_a_gpu_used_outside_any_job_is_the_nodes_to_report_and_the_admins_to_read(
    secret_client: Any, db: psycopg.Connection[Any], job_id: str, admin_token: str
) -> None:
    node = f"n-{job_id}"
    assert send(secret_client, [use(node, pid=11)], node_token(node)).status_code == 200
    # Another node's token cannot report for this node: dropped, named.
    other = send(secret_client, [use(node, pid=12)], node_token(f"{node}-x"))
    assert [r["index"] for r in other.json()["refused"]] == [0]
    # A job token cannot report one at all, and no record of this kind names a job.
    job = bearer(mint_job_token(SECRET, "default", job_id, 3600))
    refused = send(secret_client, [use(node, pid=13)], job)
    assert refused.status_code == 403 and "gpu_unallocated_use" in refused.json()["detail"]["error"]
    named = send(secret_client, [{**use(node, pid=14), "job": job_id}], node_token(node))
    assert named.status_code == 422 and named.json()["detail"]["field"] == "job"
    assert send(secret_client, [{k: v for k, v in use(node).items() if k != "node"}],
                node_token(node)).status_code == 422  # a node's record names its node
    assert db.execute("SELECT pid FROM gpu_unallocated_uses WHERE node = %s", (node,)).fetchall() == [(11,)]

    read = secret_client.get("/v1/unallocated-gpu-uses", params={"node": node}, headers=bearer(admin_token))
    assert read.status_code == 200, read.text
    [found] = read.json()["uses"]
    assert (found["node"], found["gpu_index"], found["pid"], found["uid"], found["mem_used"]) == (
        node, 3, 11, 2002, 1 << 30)
    for token in (job, node_token(node)):
        assert secret_client.get("/v1/unallocated-gpu-uses", headers=token).status_code == 403
    assert secret_client.get("/v1/unallocated-gpu-uses", params={"limit": 0},
                             headers=bearer(admin_token)).status_code == 422
