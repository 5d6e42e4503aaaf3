"""Job summaries: computed at job_ended from known samples, checked against hand-computed values."""

from __future__ import annotations

from typing import Any

import pytest

from jobsight.protocol.wire import now_us
from jobsight.rules.report_text import format_report
from tests.collector.helpers import gz, post

S = 1_000_000  # microseconds per second
GB = 2**30


def _gpu(job: str, ts: int, index: int, util: float, mem_gb: float, **extra: Any) -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": job, "ts": ts, "node": "n1", "gpu_index": index, "gpu_uuid": f"GPU-{index}",
            "util_gpu": util, "mem_used": int(mem_gb * GB), "mem_total": 80 * GB, **extra}


def _known_job(job: str, t0: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [
        {"kind": "job_started", "job": job, "ts": t0, "node": "n1", "user": "alice", "nodes": ["n1"],
         "gpus": ["0", "1"], "time_limit_s": 3600},
    ]
    # GPU 0: busy-ish, energy counter 1000 -> 7000 J.
    for i, (util, mem, energy) in enumerate([(0, 10, 1000), (50, 20, 2000), (100, 40, 4000), (50, 30, 7000)]):
        records.append(_gpu(job, t0 + i * 10 * S, 0, util, mem, energy_j=float(energy), power_w=300.0))
    # GPU 1: idle, no energy counter, power 100/200/200/100 W every 10 s.
    for i, (util, power) in enumerate([(2, 100.0), (3, 200.0), (4, 200.0), (1, 100.0)]):
        records.append(_gpu(job, t0 + i * 10 * S, 1, util, 1, power_w=power))
    # Rank 0: five 1 s steps ending at t0+5 .. t0+9 s; rank 1 differs and must not be used.
    for i in range(5):
        records.append({"kind": "step", "job": job, "ts": t0 + (5 + i) * S, "node": "n1", "rank": 0, "step": i,
                        "duration_s": 1.0, "phase": "train"})
        records.append({"kind": "step", "job": job, "ts": t0 + (20 + 3 * i) * S, "node": "n1", "rank": 1, "step": i,
                        "duration_s": 3.0, "phase": "train"})
    records.append({"kind": "step", "job": job, "ts": t0 + 2 * S, "node": "n1", "rank": 0, "step": 0,
                    "duration_s": 0.5, "phase": "val"})
    return records


def test_summary_of_known_samples(client: Any, job_id: str) -> None:
    t0 = now_us() - 3600 * S
    assert post(client, gz(_known_job(job_id, t0))).status_code == 200
    # Running: a live summary, not stored.
    live = client.get(f"/v1/jobs/{job_id}/summary").json()
    assert live["final"] is False and live["summary"]["gpu_count"] == 2
    end = {"kind": "job_ended", "job": job_id, "ts": t0 + 40 * S, "node": "n1", "exit_code": 0}
    assert post(client, gz([end])).status_code == 200

    answer = client.get(f"/v1/jobs/{job_id}/summary").json()
    assert answer["final"] is True
    assert answer["dashboard_url"].endswith(f"/job?cluster=default&job={job_id}")
    summary = answer["summary"]
    gpu0, gpu1 = summary["gpus"]
    assert gpu0["gpu_index"] == 0 and gpu0["samples"] == 4
    assert gpu0["mean_util"] == pytest.approx(50.0) and gpu0["max_util"] == pytest.approx(100.0)
    assert gpu0["peak_mem_bytes"] == 40 * GB and gpu0["peak_mem_share"] == pytest.approx(0.5)
    assert gpu0["energy_source"] == "counter" and gpu0["energy_kwh"] == pytest.approx(6000 / 3.6e6)
    assert gpu0["idle_fraction"] == pytest.approx(0.25) and gpu0["flags"] == []
    assert gpu1["mean_util"] == pytest.approx(2.5) and gpu1["idle_fraction"] == pytest.approx(1.0)
    # Trapezoids: 10 s x (150 + 200 + 150) W.
    assert gpu1["energy_source"] == "power" and gpu1["energy_kwh"] == pytest.approx(5000 / 3.6e6)
    assert gpu1["flags"] == ["idle_gpu", "memory_mostly_unused"]

    assert summary["elapsed_s"] == pytest.approx(40.0)
    assert summary["gpu_count"] == 2 and summary["gpu_hours"] == pytest.approx(2 * 40 / 3600)
    assert summary["mean_util"] == pytest.approx(26.25)
    assert summary["energy_kwh"] == pytest.approx(11000 / 3.6e6)
    steps = summary["steps"]
    assert steps["rank"] == 0 and steps["count"] == 5
    assert steps["steps_per_s"] == pytest.approx(1.0) and steps["time_to_first_step_s"] == pytest.approx(5.0)
    # Idle GPU 1 and a 26 % mean; GPU 0 peaked at half its memory, so memory is not "mostly unused".
    assert summary["flags"] == ["idle_gpu", "low_utilization"]

    row = client.get(f"/v1/jobs/{job_id}").json()
    assert row["flags"] == ["idle_gpu", "low_utilization"] and row["mean_util"] == pytest.approx(26.25)

    text = format_report(row, answer)
    assert f"Job ID: {job_id}" in text and "State: COMPLETED\n" in text
    assert "n1 (GPU 1): 2% (max 4%, idle 100%)" in text
    assert "n1 (GPU 0): 40.0GB/80.0GB (50%)" in text
    assert "5 steps at 1.00 steps/s; first step done 5.0 s after the job started" in text
    assert "idle_gpu" in text and "low_utilization" in text and answer["dashboard_url"] in text


def _refresh_pass(database_url: str) -> int | None:
    """One pass of the summary refresh timer, as the leading collector process runs it."""
    from jobsight.collector.passes.summary_refresh import SummaryRefresher

    refresher = SummaryRefresher(database_url, 60.0)
    try:
        return refresher.tick()
    finally:
        if refresher._conn is not None:
            refresher._conn.close()


def test_late_samples_mark_the_summary_and_the_pass_refreshes_it(client: Any, job_id: str, db: Any,
                                                                   database_url: str) -> None:
    """A late batch of an ended job does not recompute its summary in the group commit (the summary
    row's ``computed_at`` stays, it only gets a mark); the refresh pass brings it up to date once."""
    t0 = now_us() - 600 * S
    records = [
        {"kind": "job_started", "job": job_id, "ts": t0, "node": "n1", "gpus": ["0"]},
        _gpu(job_id, t0 + S, 0, 10, 1),
        {"kind": "job_ended", "job": job_id, "ts": t0 + 20 * S, "node": "n1", "exit_code": 3},
    ]
    assert post(client, gz(records)).status_code == 200
    query = "SELECT mean_util, computed_at, summary FROM job_summaries WHERE job_id = %s"
    first = db.execute(query, (job_id,)).fetchone()
    assert first[0] == pytest.approx(10.0) and "refresh_due" not in first[2]  # computed at job_ended
    # The node daemon's last batches arrive after the epilog's job_ended.
    assert post(client, gz([_gpu(job_id, t0 + 2 * S, 0, 90, 1)])).status_code == 200
    assert post(client, gz([_gpu(job_id, t0 + 3 * S, 0, 90, 1)])).status_code == 200
    marked = db.execute(query, (job_id,)).fetchone()
    assert marked[0] == pytest.approx(10.0) and marked[1] == first[1]  # not recomputed by the batches
    assert "refresh_due" in marked[2] and marked[2]["mean_util"] == pytest.approx(10.0)

    assert (_refresh_pass(database_url) or 0) >= 1
    refreshed = db.execute(query, (job_id,)).fetchone()
    assert refreshed[0] == pytest.approx(190 / 3) and refreshed[1] > first[1]
    assert "refresh_due" not in refreshed[2] and refreshed[2]["gpus"][0]["samples"] == 3
    # Nothing came since: the next pass leaves this summary alone.
    _refresh_pass(database_url)
    assert db.execute(query, (job_id,)).fetchone()[1] == refreshed[1]


def test_a_mark_made_while_the_summary_is_recomputed_is_kept(client: Any, job_id: str, db: Any) -> None:
    """A job_ended stored again (another node's epilog) recomputes the summary but keeps a mark that
    rows of a batch it may not have seen left, so the pass still looks again."""
    t0 = now_us() - 600 * S
    end = {"kind": "job_ended", "job": job_id, "ts": t0 + 20 * S, "node": "n1", "exit_code": 0}
    assert post(client, gz([_gpu(job_id, t0 + S, 0, 10, 1), end])).status_code == 200
    assert post(client, gz([_gpu(job_id, t0 + 2 * S, 0, 30, 1)])).status_code == 200
    assert post(client, gz([{**end, "node": "n2"}])).status_code == 200
    summary = db.execute("SELECT summary FROM job_summaries WHERE job_id = %s", (job_id,)).fetchone()[0]
    assert summary["mean_util"] == pytest.approx(20.0) and "refresh_due" in summary


def test_job_without_samples_has_an_empty_summary(client: Any, job_id: str) -> None:
    t0 = now_us() - 100 * S
    records = [{"kind": "job_started", "job": job_id, "ts": t0, "node": "n1", "gpus": ["0", "1"]},
               {"kind": "job_ended", "job": job_id, "ts": t0 + 36 * S, "node": "n1", "exit_code": 0}]
    assert post(client, gz(records)).status_code == 200
    summary = client.get(f"/v1/jobs/{job_id}/summary").json()["summary"]
    assert summary["gpus"] == [] and summary["steps"] is None and summary["mean_util"] is None
    # Allocated GPUs are billed even when never sampled.
    assert summary["gpu_count"] == 2 and summary["gpu_hours"] == pytest.approx(0.02)
    assert summary["flags"] == []


def test_unknown_job_summary_is_404(client: Any, job_id: str) -> None:
    response = client.get(f"/v1/jobs/{job_id}/summary")
    assert response.status_code == 404 and job_id in response.json()["detail"]["error"]


def test_rollup_and_samples_give_the_same_summary(client: Any, job_id: str, database_url: str) -> None:
    """The summary reads the per-minute rollup; a job stored without one reads its samples."""
    import psycopg
    from psycopg.rows import dict_row

    from jobsight.collector.jobs.summaries import compute_summary

    t0 = now_us() - 7200 * S
    records = _known_job(job_id, t0)
    # Spread over several minutes, with some samples landing late and out of order.
    records += [_gpu(job_id, t0 + (50 + 37 * i) * S, i % 2, float(i * 7 % 100), 2 + i % 5,
                     **({"energy_j": 8000.0 + i} if i % 2 == 0 else {"power_w": 150.0})) for i in range(30)]
    assert post(client, gz(records[20:])).status_code == 200
    assert post(client, gz(records[:20])).status_code == 200
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        from_rollup = compute_summary(conn, "default", job_id)
        assert conn.execute("SELECT count(*) AS n FROM gpu_minutes WHERE job_id = %s", (job_id,)).fetchone()["n"] > 4
        conn.execute("DELETE FROM gpu_minutes WHERE job_id = %s", (job_id,))
        from_samples = compute_summary(conn, "default", job_id)
        conn.rollback()
    assert from_rollup is not None and from_samples is not None
    assert len(from_rollup["gpus"]) == 2
    _assert_close(from_rollup, from_samples)


def _assert_close(a: Any, b: Any, path: str = "summary") -> None:
    """Equal, with floats compared to a relative 1e-9 (sums in another order round differently)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_close(x, y, f"{path}[{index}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9), path
    else:
        assert a == b, path
