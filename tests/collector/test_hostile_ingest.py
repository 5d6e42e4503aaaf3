"""What a user holding a job token cannot do at the collector (issue #25; the same attacks through a
real Slurm, submitted as an ordinary user, are tests/slurm/test_hostile_jobs.py):

* pre-empt another sender's batch: the ledger is keyed by the sender, not by ``(source, seq)`` alone;
* act for a job that runs as another uid: a job token counts only for the uid it was minted for;
* hide idle GPUs behind its own ``gpu_sample`` records: for a job a prolog registered, those become
  self-reported metrics, and the node's samples alone reach the tables findings, summaries and the
  audit read;
* blame the hardware with ``gpu_event`` records of Xid errors it made up: the same rule, the node's
  events alone reach ``gpu_events``.
"""

from __future__ import annotations

import gzip
from typing import Any

import psycopg
import psycopg.rows
import pytest

from jobsight.collector.ingest import write as ingest
from jobsight.protocol.tokens import mint_job_token, mint_node_token
from jobsight.protocol.wire import decode_batch, encode_batch, now_us
from tests.collector.helpers import SECRET, next_seq, post


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def prolog(job: str, node: str = "n1", uid: int = 1001) -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": now_us(), "node": node, "user": "alice", "uid": uid,
            "nodes": [node], "gpus": ["0"]}


def log(job: str) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": "harmless"}


def gpu(job: str, util: float, node: str = "n1") -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": job, "ts": now_us(), "node": node, "gpu_index": 0, "gpu_uuid": "GPU-h",
            "util_gpu": util, "mem_used": 1024}


def test_a_job_token_cannot_make_a_prologs_batch_a_duplicate(secret_client: Any, db: Any, job_id: str) -> None:
    victim = f"{job_id}-victim"
    source = f"default/n1:slurm-prolog:{victim}.0"  # what the node's prolog will use: predictable
    attacker = mint_job_token(SECRET, "default", job_id, 3600, uid=2002)
    first = post(secret_client, encode_batch(source, 0, [log(job_id)]), **bearer(attacker))
    assert first.json()["status"] == "stored"  # its own job's record: allowed, under its own name
    node = mint_node_token(SECRET, "default", "n1")
    real = post(secret_client, encode_batch(source, 0, [prolog(victim)]), **bearer(node))
    assert (real.status_code, real.json()["status"]) == (200, "stored")
    assert db.execute("SELECT user_name, nodes FROM jobs WHERE job_id = %s", (victim,)).fetchone() == ("alice", ["n1"])
    # A sender's own replay is still a duplicate, stored once.
    again = post(secret_client, encode_batch(source, 0, [prolog(victim)]), **bearer(node))
    assert again.json()["status"] == "duplicate"
    senders = db.execute("SELECT sender FROM ingest_batches WHERE source = %s ORDER BY sender", (source,)).fetchall()
    assert senders == [(f"job:default/{job_id}",), ("node:default/n1",)]


def test_a_batch_stored_before_senders_were_recorded_is_a_duplicate_for_anyone(
    database_url: str, job_id: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows migrated from before 0011 have sender ``*``: a replay after the upgrade is acknowledged
    once, as before, whoever sends it."""
    # A process looks for such rows when it first stores a batch (a new collector starts after the
    # migration); this one has stored batches already, so it starts afresh as a new one would.
    monkeypatch.setattr(ingest, "_LEGACY", ingest._LegacyLedger())
    source, seq = f"legacy-{job_id}", next_seq()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO ingest_batches (source, sender, seq, cluster, records) "
                     "VALUES (%s, '*', %s, 'default', 1)", (source, seq))
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        batch = decode_batch(gzip.decompress(encode_batch(source, seq, [log(job_id)])))
        prepared = ingest.prepare(batch)
        prepared.sender = "node:default/n1"
        written = ingest.store_group(conn, [(batch, prepared)])
        conn.commit()
        assert written.stored == [False]
        assert conn.execute("SELECT count(*) AS n FROM log_events WHERE job_id = %s", (job_id,)).fetchone()["n"] == 0


def test_a_job_token_of_another_uid_cannot_write_or_read_the_job(secret_client: Any, db: Any, job_id: str) -> None:
    node = mint_node_token(SECRET, "default", "n1")
    registered = post(secret_client, encode_batch("prolog", next_seq(), [prolog(job_id, uid=1001)]), **bearer(node))
    assert registered.status_code == 200
    other_uid = mint_job_token(SECRET, "default", job_id, 3600, uid=2002)
    refused = post(secret_client, encode_batch("other", next_seq(), [log(job_id)]), **bearer(other_uid))
    assert refused.status_code == 403
    assert "uid 2002" in refused.json()["detail"]["error"] and "uid 1001" in refused.json()["detail"]["error"]
    assert secret_client.get(f"/v1/jobs/{job_id}", headers=bearer(other_uid)).status_code == 403
    no_uid = mint_job_token(SECRET, "default", job_id, 3600)
    assert post(secret_client, encode_batch("none", next_seq(), [log(job_id)]), **bearer(no_uid)).status_code == 403
    own = mint_job_token(SECRET, "default", job_id, 3600, uid=1001)
    assert post(secret_client, encode_batch("own", next_seq(), [log(job_id)]), **bearer(own)).status_code == 200
    assert secret_client.get(f"/v1/jobs/{job_id}", headers=bearer(own)).status_code == 200
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 1


def test_a_registered_jobs_own_gpu_samples_are_kept_as_self_reported(secret_client: Any, db: Any, job_id: str) -> None:
    node = mint_node_token(SECRET, "default", "n1")
    assert post(secret_client, encode_batch("prolog", next_seq(), [prolog(job_id)]), **bearer(node)).status_code == 200
    sampled = post(secret_client, encode_batch("daemon", next_seq(), [gpu(job_id, 0.0)]), **bearer(node))
    assert sampled.status_code == 200
    own = mint_job_token(SECRET, "default", job_id, 3600, uid=1001)
    forged = post(secret_client, encode_batch("job", next_seq(), [gpu(job_id, 95.0), log(job_id)]), **bearer(own))
    assert forged.status_code == 200, forged.text
    assert db.execute("SELECT util_gpu FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchall() == [(0.0,)]
    assert db.execute("SELECT util_gpu_sum / samples FROM gpu_minutes WHERE job_id = %s", (job_id,)).fetchall() == [
        (0.0,)]
    kept = db.execute("SELECT name, value FROM metrics WHERE job_id = %s ORDER BY name", (job_id,)).fetchall()
    assert kept == [("self-reported/n1/gpu0/mem_used", 1024.0),
                    ("self-reported/n1/gpu0/util_gpu", 95.0)]
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 1


def host(job: str, energy_j: float) -> dict[str, Any]:
    return {"kind": "host_sample", "job": job, "ts": now_us(), "node": "n1", "cpu_time_s": 10.0,
            "energy_j": energy_j, "power_source": "rapl", "energy_split": "cpu_time+idle_cores"}


def test_a_registered_jobs_own_host_energy_is_kept_as_self_reported(secret_client: Any, db: Any,
                                                                     job_id: str) -> None:
    """A job cannot lower its node energy (nor charge it to another) by sending host samples with its
    own token: only the node daemon's reach host_samples, which the summaries and the audit add up."""
    node = mint_node_token(SECRET, "default", "n1")
    assert post(secret_client, encode_batch("prolog", next_seq(), [prolog(job_id)]), **bearer(node)).status_code == 200
    real = post(secret_client, encode_batch("daemon", next_seq(), [host(job_id, 500.0)]), **bearer(node))
    assert real.status_code == 200, real.text
    own = mint_job_token(SECRET, "default", job_id, 3600, uid=1001)
    forged = post(secret_client, encode_batch("job", next_seq(), [host(job_id, 0.0)]), **bearer(own))
    assert forged.status_code == 200, forged.text
    assert db.execute("SELECT energy_j, power_source FROM host_samples WHERE job_id = %s",
                      (job_id,)).fetchall() == [(500.0, "rapl")]
    kept = db.execute("SELECT name, value FROM metrics WHERE job_id = %s ORDER BY name", (job_id,)).fetchall()
    assert kept == [("self-reported/n1/host/cpu_time_s", 10.0), ("self-reported/n1/host/energy_j", 0.0)]


def xid(job: str, code: int, node: str = "n1") -> dict[str, Any]:
    return {"kind": "gpu_event", "job": job, "ts": now_us(), "node": node, "gpu_index": 0, "gpu_uuid": "GPU-h",
            "event": "xid", "code": code}


def test_a_registered_jobs_own_xid_events_are_kept_as_self_reported(secret_client: Any, db: Any, job_id: str) -> None:
    """A slow job cannot send Xid 79 for its GPU and have the node look broken (and drained): it
    does not reach gpu_events, where the node daemon's events go."""
    node = mint_node_token(SECRET, "default", "n1")
    assert post(secret_client, encode_batch("prolog", next_seq(), [prolog(job_id)]), **bearer(node)).status_code == 200
    real = post(secret_client, encode_batch("daemon", next_seq(), [gpu(job_id, 90.0), xid(job_id, 48)]), **bearer(node))
    assert real.status_code == 200, real.text
    own = mint_job_token(SECRET, "default", job_id, 3600, uid=1001)
    forged = post(secret_client, encode_batch("job", next_seq(), [xid(job_id, 79)]), **bearer(own))
    assert forged.status_code == 200, forged.text
    assert db.execute("SELECT event, code FROM gpu_events WHERE job_id = %s", (job_id,)).fetchall() == [("xid", 48)]
    kept = db.execute("SELECT name, value FROM metrics WHERE job_id = %s", (job_id,)).fetchall()
    assert kept == [("self-reported/n1/gpu0/xid", 79.0)]
    # Another node's token cannot send events for the job either: the allocation binds it.
    stranger = mint_node_token(SECRET, "default", "n9")
    refused = post(secret_client, encode_batch("n9", next_seq(), [xid(job_id, 79, node="n9")]), **bearer(stranger))
    assert refused.status_code == 200 and [r["index"] for r in refused.json()["refused"]] == [0]
    assert db.execute("SELECT event, code FROM gpu_events WHERE job_id = %s", (job_id,)).fetchall() == [("xid", 48)]


def test_a_run_outside_slurm_keeps_its_own_samples(secret_client: Any, db: Any, job_id: str) -> None:
    """No prolog registered the job: its in-process sampler is the only one it has."""
    own = mint_job_token(SECRET, "default", job_id, 3600, uid=1001)
    assert post(secret_client, encode_batch("job", next_seq(), [gpu(job_id, 42.0)]), **bearer(own)).status_code == 200
    assert db.execute("SELECT util_gpu FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchall() == [(42.0,)]


def test_a_job_token_of_another_uid_gets_no_profiling_directives(secret_client: Any, job_id: str) -> None:
    node = mint_node_token(SECRET, "default", "n1")
    assert post(secret_client, encode_batch("prolog", next_seq(), [prolog(job_id, uid=1001)]),
                **bearer(node)).status_code == 200
    other_uid = mint_job_token(SECRET, "default", job_id, 3600, uid=2002)
    own = mint_job_token(SECRET, "default", job_id, 3600, uid=1001)
    assert secret_client.get("/v1/directives", params={"job": job_id}, headers=bearer(other_uid)).status_code == 403
    assert secret_client.get("/v1/directives", params={"job": job_id}, headers=bearer(own)).status_code == 200
