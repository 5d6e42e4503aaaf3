"""The records the Citus tests store, the same on both databases: three jobs of two GPUs and two
ranks each, with a record of every kind. One ran minutes ago, one ran three days ago (its day is
packed by compaction), and one is replayed from five days ago, a day that has no partition yet.

Timestamps are fixed to whole days from today (UTC), so both databases hold the same values.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
from typing import Any

SAMPLE_EVERY_S = 5
MINUTES = 3
TRACE: bytes = json.dumps({"traceEvents": [
    {"ph": "X", "name": "aten::mm", "ts": 10, "dur": 500, "pid": 1, "tid": 1},
    {"ph": "X", "name": "aten::relu", "ts": 600, "dur": 40, "pid": 1, "tid": 1},
]}).encode()


def _us(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1_000_000)


def day_start(days_ago: int, today: dt.date | None = None) -> dt.datetime:
    today = today or dt.datetime.now(dt.UTC).date()
    return dt.datetime.combine(today - dt.timedelta(days=days_ago), dt.time(), dt.UTC)


def job_records(job: str, start: dt.datetime, *, node: str = "cn1", user: str = "alice",
                account: str = "ml", partition: str = "gpu") -> list[dict[str, Any]]:
    """One job's life: started, GPU and host samples, steps, metrics, logs, a profile, a drop
    notice, ended with exit code 0."""
    t0 = _us(start)
    end = t0 + MINUTES * 60_000_000
    records: list[dict[str, Any]] = [{
        "kind": "job_started", "job": job, "ts": t0, "node": node, "user": user, "uid": 1001,
        "account": account, "partition": partition, "name": f"train-{job}", "nodes": [node], "node_count": 1,
        "gpus": ["0", "1"], "time_limit_s": 3600, "attrs": {"qos": "normal"},
    }]
    for i, ts in enumerate(range(t0 + 1_000_000, end, SAMPLE_EVERY_S * 1_000_000)):
        for gpu in (0, 1):
            util = 90.0 - 40 * gpu + (i % 3)
            records.append({
                "kind": "gpu_sample", "job": job, "ts": ts, "node": node, "gpu_index": gpu,
                "gpu_uuid": f"GPU-{node}-{gpu}", "gpu_name": "NVIDIA H100", "util_gpu": util,
                "util_mem": util / 2, "mem_used": (30 + gpu) * 2**30, "mem_total": 80 * 2**30,
                "power_w": 300.0 + util, "energy_j": 1000.0 + i * 1500.0 + gpu, "temp_c": 60.0,
                "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "process_count": 1,
            })
        records.append({"kind": "host_sample", "job": job, "ts": ts + 1, "node": node, "cpu_util": 150.0 + i,
                        "cpu_time_s": 1.5 * i, "mem_used": 2**33, "mem_limit": 2**35})
    for step in range(1, 31):
        ts = t0 + 2_000_000 + step * 5_000_000
        for rank in (0, 1):
            records.append({
                "kind": "step", "job": job, "ts": ts + rank, "node": node, "rank": rank, "pid": 4000 + rank,
                "tid": 4000 + rank, "step": step, "epoch": step // 10, "phase": "train",
                "duration_s": 0.2 + 0.05 * rank, "data_wait_s": 0.02, "compute_s": 0.18, "forward_s": 0.06,
                "samples": 32,
            })
            records.append({"kind": "metric", "job": job, "ts": ts + 2 + rank, "node": node, "rank": rank,
                            "pid": 4000 + rank, "tid": 4000 + rank, "step": step, "name": "loss",
                            "value": 3.0 / step + rank})
    records += [
        {"kind": "log", "job": job, "ts": t0 + 3_000_000, "node": node, "rank": 0, "pid": 4000, "tid": 4000,
         "thread": "MainThread", "level": "INFO", "logger": "train", "message": "epoch 0 starts"},
        {"kind": "log", "job": job, "ts": t0 + 90_000_000, "node": node, "rank": 1, "pid": 4001, "tid": 4001,
         "thread": "MainThread", "level": "WARNING", "logger": "train", "message": "loss spiked",
         "attrs": {"step": 17}},
        {"kind": "profile", "job": job, "ts": t0 + 100_000_000, "node": node, "rank": 0, "pid": 4000,
         "profile_id": f"{job}-p1", "step_start": 18, "step_end": 21,
         "summary": {"top_ops": [{"name": "aten::mm", "self_cuda_time_us": 500}]},
         "diagnosis": [{"rule": "input_bound", "severity": "info"}],
         "trace_gz_b64": base64.b64encode(gzip.compress(TRACE)).decode()},
        {"kind": "dropped", "job": job, "ts": end - 2_000_000, "node": node, "count": 3, "reason": "queue full"},
        {"kind": "job_ended", "job": job, "ts": end, "node": node, "exit_code": 0},
    ]
    return records


def hung_records(job: str, now: dt.datetime) -> list[dict[str, Any]]:
    """A running job whose rank 1 stopped stepping 25 s before ``now`` while rank 0 goes on."""
    t0 = _us(now) - 30_000_000
    records: list[dict[str, Any]] = [{"kind": "job_started", "job": job, "ts": t0, "node": "cn4", "user": "dave",
                                      "account": "ml", "partition": "gpu", "gpus": ["0"], "time_limit_s": 3600}]
    for rank, count in ((0, 60), (1, 10)):
        records += [{"kind": "step", "job": job, "ts": t0 + i * 500_000, "node": "cn4", "rank": rank,
                     "pid": 5000 + rank, "step": i, "phase": "train", "duration_s": 0.5} for i in range(count)]
    return records


def HOURS_JOB_START(today: dt.date) -> dt.datetime:  # noqa: N802 - read as a constant of the day
    """``cit-hours`` begins 90 s before 15:00 yesterday: a minute and a half in each hour."""
    return day_start(1, today) + dt.timedelta(hours=15, seconds=-90)


def all_records(now: dt.datetime) -> dict[str, list[dict[str, Any]]]:
    """Job id → its records: ``cit-today`` (ended minutes before ``now``), ``cit-old`` (three days
    ago, packed), ``cit-late`` (five days ago, replayed late), ``cit-hours`` (yesterday across
    15:00, its first hour packed while the day is taken as still running) and ``cit-hung``
    (running, rank 1 silent)."""
    today = now.date()
    return {
        "cit-today": job_records("cit-today", now.replace(microsecond=0) - dt.timedelta(minutes=20)),
        "cit-old": job_records("cit-old", day_start(3, today) + dt.timedelta(hours=10), user="bob",
                               account="vision", node="cn2"),
        "cit-late": job_records("cit-late", day_start(5, today) + dt.timedelta(hours=22), user="carol",
                                partition="debug", node="cn3"),
        "cit-hours": job_records("cit-hours", HOURS_JOB_START(today), user="erin", node="cn5"),
        "cit-hung": hung_records("cit-hung", now),
    }
