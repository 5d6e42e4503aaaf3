"""The read API on known data: filters, pagination, SQL downsampling point counts."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post

HOUR_US = 3600 * 1_000_000


def _started(job: str, ts: int, user: str, partition: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": ts, "node": "n1", "user": user, "partition": partition, **extra}


def test_job_list_filters_and_pagination(client: Any, db: psycopg.Connection[Any], job_id: str) -> None:
    base = now_us() - 10 * HOUR_US
    jobs = {
        f"{job_id}-a": ("alice", "gpu", base),
        f"{job_id}-b": ("alice", "debug", base + HOUR_US),
        f"{job_id}-c": ("bob", "gpu", base + 2 * HOUR_US),
    }
    records = [_started(job, ts, user, part) for job, (user, part, ts) in jobs.items()]
    records.append({"kind": "job_ended", "job": f"{job_id}-a", "ts": base + HOUR_US // 2, "exit_code": 1})
    assert post(client, gz(records)).status_code == 200

    def ids(**params: Any) -> list[str]:
        response = client.get("/v1/jobs", params={"limit": 1000, **params})
        assert response.status_code == 200, response.text
        return [j["job_id"] for j in response.json()["jobs"] if j["job_id"].startswith(job_id)]

    # Running jobs first, then newest first.
    assert ids() == [f"{job_id}-c", f"{job_id}-b", f"{job_id}-a"]
    assert ids(user="alice") == [f"{job_id}-b", f"{job_id}-a"]
    assert ids(state="failed") == [f"{job_id}-a"]
    assert ids(partition="gpu", user="bob") == [f"{job_id}-c"]
    since = dt.datetime.fromtimestamp((base + HOUR_US) / 1e6, dt.UTC).isoformat()
    assert ids(since=since) == [f"{job_id}-c", f"{job_id}-b"]
    until = dt.datetime.fromtimestamp((base + HOUR_US // 4) / 1e6, dt.UTC).isoformat()
    assert ids(until=until) == [f"{job_id}-a"]

    page = client.get("/v1/jobs", params={"user": "alice", "limit": 1}).json()
    assert page["total"] >= 2 and page["next_offset"] == 1 and len(page["jobs"]) == 1
    assert client.get(f"/v1/jobs/{job_id}-a").json()["state"] == "failed"
    assert client.get(f"/v1/jobs/{job_id}-zzz").status_code == 404


def test_gpu_downsampling_returns_at_most_the_points_asked(client: Any, job_id: str) -> None:
    start = now_us() - 2 * HOUR_US
    # 2 GPUs x 3600 samples at 1 Hz over one hour; utilisation = minute of the hour.
    records = [
        {"kind": "gpu_sample", "job": job_id, "ts": start + s * 1_000_000, "node": "n1", "gpu_index": g,
         "gpu_uuid": f"GPU-{g}", "util_gpu": float(s // 60), "mem_used": s}
        for g in range(2) for s in range(3600)
    ]
    for chunk in range(0, len(records), 5000):
        assert post(client, gz(records[chunk:chunk + 5000])).status_code == 200

    for points in (1, 7, 60, 100, 3600, 5000):
        series = client.get(f"/v1/jobs/{job_id}/gpu", params={"points": points}).json()["series"]
        per_gpu = {g: [r for r in series if r["gpu_index"] == g] for g in range(2)}
        expected = min(points, 3600)
        assert [len(rows) for rows in per_gpu.values()] == [expected, expected], points
        assert sum(r["samples"] for r in per_gpu[0]) == 3600

    minutes = client.get(f"/v1/jobs/{job_id}/gpu", params={"points": 60}).json()["series"]
    gpu0 = [r for r in minutes if r["gpu_index"] == 0]
    # 60 buckets of just over a minute each: the means rise from 0 towards 59.
    assert gpu0[0]["util_gpu"] == 0.0 and 58.0 <= gpu0[-1]["util_gpu"] <= 59.0
    assert max(r["mem_used"] for r in gpu0) == 3599

    window_start = dt.datetime.fromtimestamp(start / 1e6, dt.UTC)
    window = {"start": window_start.isoformat(), "end": (window_start + dt.timedelta(minutes=10)).isoformat()}
    ten = client.get(f"/v1/jobs/{job_id}/gpu", params={**window, "points": 10}).json()["series"]
    gpu0 = [r for r in ten if r["gpu_index"] == 0]
    assert len(gpu0) == 10 and sum(r["samples"] for r in gpu0) == 601


def test_metrics_and_logs_filters(client: Any, job_id: str) -> None:
    start = now_us() - HOUR_US
    records: list[dict[str, Any]] = []
    for step in range(1000):
        for rank in range(2):
            records.append({"kind": "metric", "job": job_id, "ts": start + step * 1000, "rank": rank,
                            "step": step, "name": "loss", "value": 1.0 / (step + 1)})
    records += [
        {"kind": "log", "job": job_id, "ts": start + 1, "rank": 0, "pid": 10, "tid": 11, "level": "INFO",
         "message": "epoch 1 done"},
        {"kind": "log", "job": job_id, "ts": start + 2, "rank": 1, "pid": 20, "tid": 21, "level": "WARNING",
         "message": "slow dataloader 100%"},
        {"kind": "log", "job": job_id, "ts": start + 3, "rank": 1, "pid": 20, "tid": 22, "level": "ERROR",
         "message": "CUDA out of memory", "exception": "RuntimeError: CUDA out of memory"},
    ]
    assert post(client, gz(records)).status_code == 200

    series = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "loss", "rank": 1, "points": 50}).json()["series"]
    assert len(series) == 50 and {r["rank"] for r in series} == {1}
    assert series[0]["max"] == 1.0 and series[-1]["step"] == 999

    def messages(**params: Any) -> list[str]:
        return [r["message"] for r in client.get(f"/v1/jobs/{job_id}/logs", params=params).json()["logs"]]

    assert messages() == ["CUDA out of memory", "slow dataloader 100%", "epoch 1 done"]
    assert messages(rank=1) == ["CUDA out of memory", "slow dataloader 100%"]
    assert messages(pid=10) == ["epoch 1 done"]
    assert messages(tid=22) == ["CUDA out of memory"]
    assert messages(level="WARNING") == ["CUDA out of memory", "slow dataloader 100%"]
    assert messages(text="out of MEMORY") == ["CUDA out of memory"]
    # LIKE wildcards in the search text are matched literally.
    assert messages(text="100%") == ["slow dataloader 100%"]
    assert messages(text="%") == ["slow dataloader 100%"]


def test_wide_buckets_read_the_minute_rollup_and_agree_with_the_samples(
    client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    start = (now_us() - 5 * HOUR_US) // 60_000_000 * 60_000_000 + 17_000_000  # not on a minute edge
    records = [
        {"kind": "gpu_sample", "job": job_id, "ts": start + s * 5_000_000, "node": "n1", "gpu_index": g,
         "gpu_uuid": f"GPU-{g}", "util_gpu": float((s * 7 + g) % 101), "power_w": 100.0 + s % 50,
         "mem_used": s * 1000, "energy_j": 10.0 * s}
        for g in range(2) for s in range(2 * 720)  # two hours at 0.2 Hz
    ]
    # Batches arrive out of order and one is replayed: the rollup must not care.
    chunks = [records[i:i + 700] for i in range(0, len(records), 700)]
    bodies = [gz(chunk) for chunk in chunks]
    for body in [*reversed(bodies), bodies[1]]:
        assert post(client, body).status_code == 200

    minutes = db.execute("SELECT count(*), sum(samples) FROM gpu_minutes WHERE job_id = %s", (job_id,)).fetchone()
    assert minutes == (2 * 121, len(records))  # 120 minutes plus the one the 17 s offset spills into

    whole = client.get(f"/v1/jobs/{job_id}/gpu", params={"points": 1}).json()["series"]
    raw = db.execute(
        "SELECT gpu_index, avg(util_gpu), avg(power_w), max(mem_used), max(energy_j), count(*) FROM gpu_samples"
        " WHERE job_id = %s GROUP BY gpu_index ORDER BY gpu_index", (job_id,)).fetchall()
    for row, (gpu, util, power, mem, energy, count) in zip(whole, raw, strict=True):
        assert row["gpu_index"] == gpu and row["samples"] == count
        assert abs(row["util_gpu"] - util) < 1e-9 and abs(row["power_w"] - power) < 1e-9
        assert (row["mem_used"], row["energy_j"]) == (mem, energy)

    for points in (3, 30, 59):  # buckets of two minutes or more: the rollup, every bucket filled
        series = client.get(f"/v1/jobs/{job_id}/gpu", params={"points": points}).json()["series"]
        assert [sum(1 for r in series if r["gpu_index"] == g) for g in range(2)] == [points, points]
        assert sum(r["samples"] for r in series) == len(records)

    # Proof of which table answers: without the raw rows, wide buckets still come back whole.
    window = {"start": dt.datetime.fromtimestamp(start / 1e6, dt.UTC).isoformat(),
              "end": dt.datetime.fromtimestamp((start + 2 * HOUR_US) / 1e6, dt.UTC).isoformat()}
    db.execute("DELETE FROM gpu_samples WHERE job_id = %s", (job_id,))
    series = client.get(f"/v1/jobs/{job_id}/gpu", params={**window, "points": 3}).json()["series"]
    assert sum(r["samples"] for r in series) == len(records)


def test_running_jobs_show_live_utilisation_so_idle_allocations_can_be_found(client: Any, job_id: str) -> None:
    now = now_us()
    idle, busy = f"{job_id}-idle", f"{job_id}-busy"
    records: list[dict[str, Any]] = []
    for job, util in ((idle, 1.0), (busy, 90.0)):
        records.append(_started(job, now - 3 * HOUR_US, "carol", "gpu"))
        # An hour ago the idle job was busy: only the last hour counts for a running job.
        records += [{"kind": "gpu_sample", "job": job, "ts": now - 2 * HOUR_US + s * 60_000_000, "node": "n1",
                     "gpu_index": 0, "gpu_uuid": "GPU-0", "util_gpu": 95.0} for s in range(30)]
        records += [{"kind": "gpu_sample", "job": job, "ts": now - 30 * 60_000_000 + s * 60_000_000, "node": "n1",
                     "gpu_index": 0, "gpu_uuid": "GPU-0", "util_gpu": util} for s in range(30)]
    assert post(client, gz(records)).status_code == 200

    def listed(**params: Any) -> dict[str, dict[str, Any]]:
        jobs = client.get("/v1/jobs", params={"user": "carol", "limit": 1000, **params}).json()["jobs"]
        return {j["job_id"]: j for j in jobs if j["job_id"].startswith(job_id)}

    both = listed()
    assert both[idle]["mean_util"] == 1.0 and both[idle]["mean_util_live"] is True
    assert both[busy]["mean_util"] == 90.0
    assert list(listed(max_mean_util=5)) == [idle]

    # Once the job has ended, its summary's figure (the whole run) is the one shown.
    assert post(client, gz([{"kind": "job_ended", "job": idle, "ts": now, "exit_code": 0}])).status_code == 200
    ended = listed()[idle]
    assert ended["mean_util_live"] is False and ended["mean_util"] == (30 * 95.0 + 30 * 1.0) / 60
