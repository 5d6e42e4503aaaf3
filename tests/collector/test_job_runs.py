"""A requeued job's runs (collector/jobs/job_runs.py): each run apart, GPU-hours over all of them."""

from __future__ import annotations

from typing import Any

import pytest

from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post

S = 1_000_000  # microseconds per second


def _started(job: str, ts: int, run: int | None) -> dict[str, Any]:
    record = {"kind": "job_started", "job": job, "ts": ts, "node": "n1", "user": "alice", "nodes": ["n1"],
              "gpus": ["0"], "time_limit_s": 3600}
    return record if run is None else {**record, "run": run}


def _ended(job: str, ts: int, run: int | None, exit_code: int = 0) -> dict[str, Any]:
    record = {"kind": "job_ended", "job": job, "ts": ts, "node": "n1", "exit_code": exit_code}
    return record if run is None else {**record, "run": run}


def _work(job: str, t0: int, util: float, steps: int) -> list[dict[str, Any]]:
    """Four GPU samples 10 s apart at ``util`` %, and ``steps`` 1 s train steps from 0 on rank 0."""
    records: list[dict[str, Any]] = [
        {"kind": "gpu_sample", "job": job, "ts": t0 + (1 + 10 * i) * S, "node": "n1", "gpu_index": 0,
         "gpu_uuid": "GPU-0", "util_gpu": util, "power_w": 200.0}
        for i in range(4)
    ]
    records += [{"kind": "step", "job": job, "ts": t0 + (2 + i) * S, "node": "n1", "rank": 0, "step": i,
                 "duration_s": 1.0, "phase": "train"} for i in range(steps)]
    return records


def _job(db: Any, job: str) -> dict[str, Any]:
    row = db.execute("SELECT state, exit_code, run, run_start, start_time, end_time FROM jobs WHERE job_id = %s",
                     (job,)).fetchone()
    return dict(zip(("state", "exit_code", "run", "run_start", "start_time", "end_time"), row, strict=True))


def test_requeued_job_keeps_its_runs_apart(client: Any, db: Any, job_id: str) -> None:
    t0 = now_us() - 3600 * S
    t1 = t0 + 300 * S  # run 1 starts 5 minutes later: 4 minutes pending after run 0 ended at +60 s
    first = [_started(job_id, t0, 0), *_work(job_id, t0, 10.0, 5), _ended(job_id, t0 + 60 * S, 0, exit_code=3)]
    assert post(client, gz(first)).status_code == 200
    assert post(client, gz([_started(job_id, t1, 1), *_work(job_id, t1, 90.0, 3)])).status_code == 200

    running = _job(db, job_id)
    assert running["state"] == "running" and running["end_time"] is None and running["exit_code"] is None
    assert running["run"] == 1 and running["start_time"] < running["run_start"]
    # Run 0's summary is gone while run 1 runs: the jobs list shows run 1's live figures, not run 0's.
    assert db.execute("SELECT count(*) FROM job_summaries WHERE job_id = %s", (job_id,)).fetchone()[0] == 0

    assert post(client, gz([_ended(job_id, t1 + 120 * S, 1)])).status_code == 200
    ended = _job(db, job_id)
    assert ended["state"] == "completed" and ended["exit_code"] == 0

    summary = client.get(f"/v1/jobs/{job_id}/summary").json()["summary"]
    # The last run alone: its samples (util 90, not a mean with run 0's 10), its 3 steps, its span.
    assert summary["run"] == 1
    assert summary["gpus"][0]["samples"] == 4 and summary["gpus"][0]["mean_util"] == pytest.approx(90.0)
    assert summary["steps"]["count"] == 3
    assert summary["elapsed_s"] == pytest.approx(120.0)
    assert summary["run_gpu_hours"] == pytest.approx(120.0 / 3600)
    # GPU-hours count both runs: 60 s + 120 s on one GPU; the 4 minutes pending in between do not.
    assert summary["gpu_hours"] == pytest.approx(180.0 / 3600)
    row = db.execute("SELECT gpu_hours FROM job_summaries WHERE job_id = %s", (job_id,)).fetchone()
    assert row[0] == pytest.approx(180.0 / 3600)
    assert [(r["run"], r["exit_code"], r["state"]) for r in summary["runs"]] == [(0, 3, "failed")]


def test_an_earlier_runs_late_end_does_not_end_the_next_run(client: Any, db: Any, job_id: str) -> None:
    t0 = now_us() - 3600 * S
    t1 = t0 + 100 * S
    # Run 0's epilog was spooled and replayed only after run 1 started.
    assert post(client, gz([_started(job_id, t0, 0), _started(job_id, t1, 1)])).status_code == 200
    assert post(client, gz([_ended(job_id, t0 + 50 * S, 0, exit_code=143)])).status_code == 200
    job = _job(db, job_id)
    assert job["state"] == "running" and job["end_time"] is None and job["run"] == 1
    run0 = db.execute("SELECT end_time, exit_code FROM job_runs WHERE job_id = %s AND run = 0", (job_id,)).fetchone()
    assert run0 is not None and run0[1] == 143

    # A replayed run-0 prolog changes nothing either.
    assert post(client, gz([_started(job_id, t0, 0)])).status_code == 200
    assert _job(db, job_id)["run"] == 1


def test_a_run_that_never_ended_counts_until_the_next_run(client: Any, db: Any, job_id: str) -> None:
    t0 = now_us() - 3600 * S
    # Run 0's node died with its epilog: it ran until run 1 started (100 s).
    records = [_started(job_id, t0, 0), _started(job_id, t0 + 100 * S, 1), _ended(job_id, t0 + 130 * S, 1)]
    assert post(client, gz(records)).status_code == 200
    summary = client.get(f"/v1/jobs/{job_id}/summary").json()["summary"]
    assert summary["elapsed_s"] == pytest.approx(30.0)
    assert summary["gpu_hours"] == pytest.approx(130.0 / 3600)
    assert summary["runs"][0]["end"] is None and summary["runs"][0]["state"] is None


def test_records_without_a_run_are_the_current_run(client: Any, db: Any, job_id: str) -> None:
    """The training process's own records carry no run: they never start or end a different one."""
    t0 = now_us() - 3600 * S
    records = [_started(job_id, t0, None), *_work(job_id, t0, 50.0, 2), _ended(job_id, t0 + 40 * S, None)]
    assert post(client, gz(records)).status_code == 200
    job = _job(db, job_id)
    assert job["run"] == 0 and job["run_start"] is None and job["state"] == "completed"
    summary = client.get(f"/v1/jobs/{job_id}/summary").json()["summary"]
    assert summary["run"] == 0 and summary["runs"] == [] and summary["steps"]["count"] == 2
