"""How much one job may claim, on the real collector app and database: GPUs and ranks at ingest
(``max_gpus_per_job``, ``max_ranks_per_job``: a record past them is a 422 naming it, and nothing of
its batch is stored) and open profile requests (``max_open_profile_requests``: one more is a 429)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.config.settings import SettingsError, load_collector_settings
from jobsight.collector.ingest.body import ClaimBounds, decode_body
from jobsight.protocol.wire import WireError, decode_batch, now_us
from tests.collector.helpers import gz, post

GPUS, RANKS, OPEN = 4096, 65536, 4
"""The defaults of max_gpus_per_job, max_ranks_per_job and max_open_profile_requests."""


def sample(job: str, index: int, ts: int) -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": job, "ts": ts, "node": "n1", "gpu_index": index, "gpu_uuid": f"GPU-{index}",
            "util_gpu": 50.0}


def step(job: str, rank: int, ts: int) -> dict[str, Any]:
    return {"kind": "step", "job": job, "ts": ts, "node": "n1", "rank": rank, "step": 1, "duration_s": 0.5}


def started(job: str, ts: int, gpus: int) -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": ts, "node": "n1", "user": "alice",
            "gpus": [str(i) for i in range(gpus)]}


def refused(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    detail: dict[str, Any] = response.json()["detail"]
    return detail


def stored(db: psycopg.Connection[Any], table: str, job: str) -> int:
    row = db.execute(f"SELECT count(*) FROM {table} WHERE job_id = %s", (job,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_gpu_index_past_the_bound_is_refused_by_record_and_field(
    client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    ts = now_us()
    records = [started(job_id, ts, 2), sample(job_id, GPUS - 1, ts + 1), sample(job_id, GPUS, ts + 2)]
    assert refused(post(client, gz(records))) == {
        "error": f"gpu_index {GPUS} is past the collector's max_gpus_per_job: it must be under {GPUS}",
        "record": 2, "field": "gpu_index"}
    assert stored(db, "gpu_samples", job_id) == 0 and stored(db, "jobs", job_id) == 0  # nothing of the batch
    assert post(client, gz(records[:2])).status_code == 200  # the last index a job may have
    assert stored(db, "gpu_samples", job_id) == 1


def test_a_gpu_event_past_the_gpu_bound_is_refused(client: Any, db: psycopg.Connection[Any], job_id: str) -> None:
    """An Xid event names its GPU like a sample does: held to the same bound."""
    ts = now_us()
    event = {"kind": "gpu_event", "job": job_id, "ts": ts, "node": "n1", "gpu_index": GPUS, "gpu_uuid": "GPU-x",
             "event": "xid", "code": 79}
    assert refused(post(client, gz([event]))) == {
        "error": f"gpu_index {GPUS} is past the collector's max_gpus_per_job: it must be under {GPUS}",
        "record": 0, "field": "gpu_index"}
    assert post(client, gz([{**event, "gpu_index": GPUS - 1}])).status_code == 200
    assert stored(db, "gpu_events", job_id) == 1


def test_a_rank_past_the_bound_is_refused_by_record_and_field(
    client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    ts = now_us()
    log = {"kind": "log", "job": job_id, "ts": ts, "node": "n1", "rank": RANKS - 1, "level": "INFO", "message": "m"}
    records = [log, step(job_id, 3, ts + 1), step(job_id, RANKS, ts + 2)]
    assert refused(post(client, gz(records))) == {
        "error": f"rank {RANKS} is past the collector's max_ranks_per_job: it must be under {RANKS}",
        "record": 2, "field": "rank"}
    assert stored(db, "steps", job_id) == 0
    assert post(client, gz(records[:2])).status_code == 200
    assert stored(db, "steps", job_id) == 1 and stored(db, "log_events", job_id) == 1


def test_a_job_started_listing_more_gpus_than_the_bound_is_refused(
    client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    # At the default bound the protocol's own cap on a list (4096 items) answers first, at the same
    # record and field; a smaller bound is the collector's (test_the_bounds_are_the_collectors_settings).
    ts = now_us()
    assert refused(post(client, gz([step(job_id, 0, ts), started(job_id, ts, GPUS + 1)]))) == {
        "error": "expected a list", "record": 1, "field": "gpus"}
    assert stored(db, "jobs", job_id) == 0
    assert post(client, gz([started(job_id, ts, GPUS)])).status_code == 200
    row = db.execute("SELECT cardinality(gpus) FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None and row[0] == GPUS


def test_a_batch_checked_record_by_record_is_bounded_alike(client: Any, job_id: str) -> None:
    # A profile's summary has a content check of its own: its batch is validated record by record,
    # with no columns, and the bound reads the records themselves.
    ts = now_us()
    profile = {"kind": "profile", "job": job_id, "ts": ts, "node": "n1", "rank": 0, "profile_id": "p1",
               "summary": {}}
    metric = {"kind": "metric", "job": job_id, "ts": ts + 1, "node": "n1", "rank": RANKS + 7, "name": "loss",
              "value": 1.0}
    body = gz([profile, metric])
    assert decode_batch(gzip.decompress(body)).columns is None
    assert refused(post(client, body)) == {
        "error": f"rank {RANKS + 7} is past the collector's max_ranks_per_job: it must be under {RANKS}",
        "record": 1, "field": "rank"}


def test_the_bounds_are_the_collectors_settings(tmp_path: Path) -> None:
    defaults = load_collector_settings(data_dir=tmp_path)
    assert (defaults.max_gpus_per_job, defaults.max_ranks_per_job, defaults.max_open_profile_requests) == (
        GPUS, RANKS, OPEN)
    small = ClaimBounds.of(load_collector_settings(data_dir=tmp_path, max_gpus_per_job=8, max_ranks_per_job=2))
    ts = now_us()
    body = gz([sample("j", 7, ts), step("j", 1, ts), started("j", ts, 8)])
    batch, _ = decode_body(body, "gzip", 2**20, small)
    assert len(batch.records) == 3
    for records, error in (
        ([sample("j", 7, ts), sample("j", 8, ts)],
         ("gpu_index 8 is past the collector's max_gpus_per_job: it must be under 8", 1, "gpu_index")),
        ([step("j", 2, ts)], ("rank 2 is past the collector's max_ranks_per_job: it must be under 2", 0, "rank")),
        ([step("j", 0, ts), started("j", ts, 9)],
         ("gpus lists 9 items, more than the collector's max_gpus_per_job of 8", 1, "gpus")),
    ):
        with pytest.raises(WireError) as caught:
            decode_body(gz(records), "gzip", 2**20, small)
        assert (caught.value.message, caught.value.record, caught.value.field) == error
    for name, value in (("max_gpus_per_job", 0), ("max_ranks_per_job", 0), ("max_open_profile_requests", 0)):
        with pytest.raises(SettingsError, match=f"JOBSIGHT_{name.upper()}"):
            load_collector_settings(data_dir=tmp_path, **{name: value})


@pytest.fixture
def known_job(client: Any, job_id: str) -> str:
    assert post(client, gz([started(job_id, now_us(), 2)])).status_code == 200
    return job_id


def ask(client: Any, job: str, **body: Any) -> Any:
    return client.post(f"/v1/jobs/{job}/profile-requests", json={"steps": 2, **body})


def test_a_job_may_have_at_most_four_profile_requests_open(
    client: Any, db: psycopg.Connection[Any], known_job: str
) -> None:
    ids = []
    for _ in range(OPEN):
        response = ask(client, known_job)
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    response = ask(client, known_job)
    assert response.status_code == 429
    assert response.json() == {"detail": {
        "error": f"job {known_job} has {OPEN} profile requests pending or running, the most the collector's "
                 f"max_open_profile_requests allows ({OPEN}): ask again once one is done or failed",
        "open": OPEN, "max": OPEN}}
    assert stored(db, "profile_requests", known_job) == OPEN  # the refused one was not written

    # One running, one failed by its agent: a place frees up, and only one.
    assert client.post(f"/v1/profile-requests/{ids[0]}/state", json={"state": "running"}).status_code == 200
    assert client.post(f"/v1/profile-requests/{ids[1]}/state", json={"state": "failed", "reason": "x"}).status_code \
        == 200
    assert ask(client, known_job).status_code == 201
    assert ask(client, known_job).status_code == 429

    # Pending past the timeout: no agent took them, they are failed and no longer count.
    db.execute("UPDATE profile_requests SET created_at = now() - interval '1 hour' WHERE job_id = %s AND state = "
               "'pending'", (known_job,))
    assert ask(client, known_job).status_code == 201
    states = db.execute("SELECT state, count(*) FROM profile_requests WHERE job_id = %s GROUP BY state ORDER BY state",
                        (known_job,)).fetchall()
    assert states == [("failed", 4), ("pending", 1), ("running", 1)]


def test_a_profile_request_for_a_rank_past_the_bound_is_refused(client: Any, known_job: str) -> None:
    response = ask(client, known_job, ranks=[0, RANKS])
    assert refused(response) == {"error": f"rank {RANKS} is past the collector's max_ranks_per_job: it must be under "
                                          f"{RANKS}", "field": "ranks"}
    assert ask(client, known_job, ranks=[0, RANKS - 1]).status_code == 201


@pytest.fixture
def one_request_client(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Any]:
    """The collector in-process with ``max_open_profile_requests = 1``."""
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app

    settings = load_collector_settings(database_url=database_url, data_dir=data_dir, max_open_profile_requests=1)
    with TestClient(create_app(settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {admin_token}"
        yield test_client


def test_requests_at_once_cannot_pass_the_bound_together(one_request_client: Any, job_id: str) -> None:
    client = one_request_client
    assert post(client, gz([started(job_id, now_us(), 1)])).status_code == 200

    def attempt(_: int) -> int:
        return int(ask(client, job_id).status_code)

    with ThreadPoolExecutor(8) as pool:
        statuses = sorted(pool.map(attempt, range(8)))
    assert statuses == [201] + [429] * 7, statuses
