"""Job and node tokens at the collector: who may write and read what, and the secret file."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobsight.collector.api.auth import ensure_admin_token
from jobsight.protocol.tokens import mint_job_token, mint_node_token
from jobsight.protocol.wire import encode_batch, now_us
from tests.collector.helpers import SECRET, next_seq, post

REPO = Path(__file__).resolve().parents[2]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def batch(records: list[dict[str, Any]], cluster: str = "default") -> bytes:
    return encode_batch("auth-test", next_seq(), records, cluster)


def log_record(job: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": "hello", **extra}


def gpu_record(job: str, node: str = "n1") -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": job, "ts": now_us(), "node": node, "gpu_index": 0, "gpu_uuid": "GPU-x",
            "util_gpu": 50.0}


def started(job: str, node: str) -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": now_us(), "node": node, "user": "alice", "gpus": ["0"]}


def test_job_token_writes_its_own_job(secret_client: Any, job_id: str, db: Any) -> None:
    token = mint_job_token(SECRET, "default", job_id, 3600)
    response = post(secret_client, batch([log_record(job_id)]), **bearer(token))
    assert response.status_code == 200, response.text
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 1


def test_job_token_cannot_write_another_job(secret_client: Any, job_id: str, db: Any) -> None:
    token = mint_job_token(SECRET, "default", job_id, 3600)
    other = job_id + "-other"
    response = post(secret_client, batch([log_record(job_id), log_record(other)]), **bearer(token))
    assert response.status_code == 403
    error = response.json()["detail"]["error"]
    assert "record 1" in error and other in error and job_id in error
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = ANY(%s)", ([job_id, other],)).fetchone()[0] == 0


def test_job_token_adds_run_metadata_but_not_accounting(secret_client: Any, job_id: str, db: Any) -> None:
    token = mint_job_token(SECRET, "default", job_id, 3600)
    run = {"kind": "job_started", "job": job_id, "ts": now_us(), "node": "n1", "name": "fit", "attrs": {"lr": 0.1}}
    assert post(secret_client, batch([run]), **bearer(token)).status_code == 200
    assert db.execute("SELECT attrs FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0] == {"lr": 0.1}

    relabel = {**run, "user": "somebody-else"}
    response = post(secret_client, batch([log_record(job_id), relabel]), **bearer(token))
    assert response.status_code == 403 and "record 1" in response.json()["detail"]["error"]
    assert "user" in response.json()["detail"]["error"]
    ended = {"kind": "job_ended", "job": job_id, "ts": now_us(), "exit_code": 0}
    assert post(secret_client, batch([ended]), **bearer(token)).status_code == 403
    assert db.execute("SELECT user_name, state FROM jobs WHERE job_id = %s", (job_id,)).fetchone() == (None, "running")


def test_job_token_cannot_write_another_cluster(secret_client: Any, job_id: str) -> None:
    token = mint_job_token(SECRET, "default", job_id, 3600)
    response = post(secret_client, batch([log_record(job_id)], cluster="elsewhere"), **bearer(token))
    assert response.status_code == 403
    assert "cluster" in response.json()["detail"]["error"]


@pytest.mark.parametrize(
    ("make_token", "reason"),
    [
        (lambda job: mint_job_token(SECRET, "default", job, 60, now=1_700_000_000), "expired"),
        (lambda job: mint_job_token("not-the-secret", "default", job, 3600), "signature"),
        (lambda job: "js1.eyJraW5kIjoiam9iIn0.AAAA", "signature"),
        (lambda job: "js1.only-two", "malformed"),
        (lambda job: "jsa_not-the-admin-token", "unknown token"),
    ],
    ids=["expired", "other-secret", "forged", "malformed", "unknown"],
)
def test_bad_tokens_get_401_with_the_reason(secret_client: Any, job_id: str, make_token: Any, reason: str) -> None:
    response = post(secret_client, batch([log_record(job_id)]), **bearer(make_token(job_id)))
    assert response.status_code == 401
    assert reason in response.json()["detail"]["error"]
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_without_a_secret_job_tokens_are_refused(client: Any, job_id: str) -> None:
    """``client`` has no cluster secret file: tokens are refused and the answer says why."""
    token = mint_job_token(SECRET, "default", job_id, 3600)
    response = post(client, batch([log_record(job_id)]), **bearer(token))
    assert response.status_code == 401
    assert "no cluster secret" in response.json()["detail"]["error"]


def test_node_token_registers_and_samples_its_jobs(secret_client: Any, job_id: str, db: Any) -> None:
    token = mint_node_token(SECRET, "default", "n1")
    # job_started and samples in one batch: the job is registered on n1 by the batch itself.
    assert post(secret_client, batch([started(job_id, "n1"), gpu_record(job_id)]), **bearer(token)).status_code == 200
    response = post(secret_client, batch([gpu_record(job_id), {"kind": "host_sample", "job": job_id, "ts": now_us(),
                                                                "node": "n1", "cpu_util": 10.0}]), **bearer(token))
    assert response.status_code == 200, response.text
    end = {"kind": "job_ended", "job": job_id, "ts": now_us(), "node": "n1", "exit_code": 0}
    assert post(secret_client, batch([end]), **bearer(token)).status_code == 200
    assert db.execute("SELECT count(*) FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchone()[0] == 2
    assert db.execute("SELECT state FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0] == "completed"


def refusals(response: Any) -> list[tuple[int, str]]:
    """A node's batch is stored without the records it may not write: 200, each dropped one named."""
    assert response.status_code == 200, response.text
    return [(r["index"], r["reason"]) for r in response.json().get("refused", [])]


def test_node_token_cannot_sample_a_job_of_another_node(secret_client: Any, job_id: str, db: Any) -> None:
    assert post(secret_client, batch([started(job_id, "n1")]), **bearer(mint_node_token(SECRET, "default", "n1"))
                ).status_code == 200
    n2 = mint_node_token(SECRET, "default", "n2")
    [(index, reason)] = refusals(post(secret_client, batch([gpu_record(job_id, node="n2")]), **bearer(n2)))
    assert index == 0 and f"job {job_id} is not registered on node n2" in reason
    assert db.execute("SELECT count(*) FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchone()[0] == 0


def test_node_token_cannot_write_as_another_node(secret_client: Any, job_id: str, db: Any) -> None:
    response = post(secret_client, batch([gpu_record(job_id, node="n9")]),
                    **bearer(mint_node_token(SECRET, "default", "n1")))
    [(index, reason)] = refusals(response)
    assert index == 0 and "node n9" in reason
    assert db.execute("SELECT count(*) FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchone()[0] == 0


def test_node_token_replays_job_records_of_its_jobs(secret_client: Any, job_id: str) -> None:
    """The daemon replays what a job on its node spooled: any kind, but only for its node's jobs."""
    n1 = bearer(mint_node_token(SECRET, "default", "n1"))
    assert post(secret_client, batch([started(job_id, "n1")]), **n1).status_code == 200
    assert post(secret_client, batch([log_record(job_id, node="n1")]), **n1).status_code == 200
    n2 = bearer(mint_node_token(SECRET, "default", "n2"))
    response = post(secret_client, batch([log_record(job_id, node="n2")]), **n2)
    assert [index for index, _ in refusals(response)] == [0]


def test_node_token_may_sample_a_job_not_registered_yet(secret_client: Any, job_id: str) -> None:
    """After an outage the daemon's samples can arrive before the prolog's spooled job_started."""
    response = post(secret_client, batch([gpu_record(job_id)]), **bearer(mint_node_token(SECRET, "default", "n1")))
    assert response.status_code == 200, response.text


def test_reads_with_job_and_node_tokens(secret_client: Any, job_id: str, admin_token: str) -> None:
    other = job_id + "-other"
    for job in (job_id, other):
        assert post(secret_client, batch([log_record(job)]), **bearer(admin_token)).status_code == 200
    own = bearer(mint_job_token(SECRET, "default", job_id, 3600))
    assert secret_client.get(f"/v1/jobs/{job_id}", headers=own).status_code == 200
    assert secret_client.get(f"/v1/jobs/{job_id}/summary", headers=own).status_code == 200
    refused = secret_client.get(f"/v1/jobs/{other}", headers=own)
    assert refused.status_code == 403 and "only that job" in refused.json()["detail"]["error"]
    assert secret_client.get("/v1/jobs", headers=own).status_code == 403
    # The same job id in another cluster is another job.
    assert secret_client.get(f"/v1/jobs/{job_id}", params={"cluster": "other"}, headers=own).status_code == 403
    assert secret_client.get(f"/v1/jobs/{job_id}/logs", params={"cluster": "other"}, headers=own).status_code == 403
    node = bearer(mint_node_token(SECRET, "default", "n1"))
    assert secret_client.get(f"/v1/jobs/{job_id}", headers=node).status_code == 403


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_collector_refuses_a_readable_secret(tmp_path: Path, mode: int) -> None:
    secret_file = tmp_path / "cluster_secret"
    secret_file.write_text(SECRET)
    secret_file.chmod(mode)
    env = {**os.environ, "JOBSIGHT_DATABASE_URL": "postgresql://127.0.0.1:1/none", "JOBSIGHT_DATA_DIR": str(tmp_path),
           "JOBSIGHT_SECRET_FILE": str(secret_file), "JOBSIGHT_PORT": "1"}
    result = subprocess.run([sys.executable, "-m", "jobsight", "collector"], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"cluster secret {secret_file} is readable by other users (mode {mode:o}); chmod 600 it" in result.stderr


def test_missing_secret_is_logged(database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    settings = load_collector_settings(database_url=database_url, data_dir=tmp_path)
    with caplog.at_level("WARNING", logger="jobsight.collector"):
        create_app(settings)
    assert "job and node tokens will not be accepted" in caplog.text


def _admin_token_in_child(path: str, start: float) -> str:
    time.sleep(max(0.0, start - time.time()))  # every child at the same instant, as workers start
    return ensure_admin_token(Path(path))


def test_workers_starting_at_once_share_one_admin_token(tmp_path: Path) -> None:
    """Every --workers process creates the token if absent: they race, and all must come out
    with the same whole token (the loser used to crash with FileExistsError)."""
    path = tmp_path / "data" / "admin_token"
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        start = time.time() + 3
        tokens = pool.starmap(_admin_token_in_child, [(str(path), start)] * 24)
    assert len(set(tokens)) == 1
    assert tokens[0].startswith("jsa_") and path.read_text().strip() == tokens[0]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in path.parent.iterdir()] == ["admin_token"]
