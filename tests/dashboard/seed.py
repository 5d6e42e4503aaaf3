"""Seeded dashboard data, written with SQL so every timestamp and figure is known.

The audit period is 2024-03-04..2024-03-05 (UTC). By hand:

| job | user  | account | partition | GPUs | run (UTC)          | inside | GPU-h | util | kWh job | kWh inside |
| a2  | alice | ml      | gpu       | 4    | 03-04 10:00–14:00  | 4 h    | 16    | 80   | 4.0     | 4.0        |
| b1  | bob   | physics | gpu       | 8    | 03-04 22:00–05 02  | 4 h    | 32    | 3    | 2.0     | 2.0        |
| b2  | bob   | physics | debug     | 1    | 03-03 20:00–04 04  | 4 of 8 | 4     | 20   | 1.0     | 0.5        |

Totals: 3 jobs, 52 GPU-hours, 6.5 kWh, mean utilisation (16·80 + 32·3 + 4·20) / 52 = 28.
Daily: 03-04 → 16 + 16 + 4 = 36 GPU-h; 03-05 → 16 GPU-h.
``a1`` is alice's running job with two GPUs, two ranks (rank 1 a straggler), metrics,
logs, epochs and a profile; it started 30 minutes before the seed ran.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import PARTITIONED_TABLES
from jobsight.collector.tiers.rollup import rebuild_minutes
from jobsight.collector.tiers.step_rollup import rebuild as rebuild_steps

UTC = dt.UTC
PERIOD = (dt.date(2024, 3, 4), dt.date(2024, 3, 5))
TOTAL_GPU_HOURS = 52.0
TOTAL_KWH = 6.5


@dataclass(frozen=True)
class Seed:
    cluster: str
    running: str  # alice's running job
    alice_done: str
    bob_idle: str
    bob_debug: str


def _t(day: int, hour: int) -> dt.datetime:
    return dt.datetime(2024, 3, day, hour, tzinfo=UTC)


def _job(conn: psycopg.Connection[Any], cluster: str, job_id: str, user: str, account: str, partition: str,
         gpus: list[str], start: dt.datetime, end: dt.datetime | None, name: str) -> None:
    conn.execute(
        """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count, gpus,
                             start_time, end_time, state, exit_code, last_seen)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
        (cluster, job_id, user, account, partition, name, sorted({g.split(":")[0] for g in gpus}),
         len({g.split(":")[0] for g in gpus}), gpus, start, end, "running" if end is None else "completed",
         None if end is None else 0, end or start),
    )


def _summary(conn: psycopg.Connection[Any], cluster: str, job_id: str, gpus: int, hours: float, util: float,
             kwh: float, flags: list[str]) -> None:
    conn.execute(
        """INSERT INTO job_summaries (cluster, job_id, gpu_count, gpu_hours, mean_util, energy_kwh, flags, summary)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""",
        (cluster, job_id, gpus, gpus * hours, util, kwh, flags, Jsonb({})),
    )


def seed(database_url: str) -> Seed:
    cluster = f"dash-{uuid.uuid4().hex[:8]}"
    s = Seed(cluster, "a1-running", "a2-done", "b1-idle", "b2-debug")
    now = dt.datetime.now(UTC).replace(microsecond=0)
    start = now - dt.timedelta(minutes=30)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.row_factory = psycopg.rows.dict_row
        keeper = PartitionKeeper()
        for table in PARTITIONED_TABLES:
            keeper.ensure(conn, table, {start.date(), now.date()})
        with conn.transaction():
            _job(conn, cluster, s.running, "alice", "ml", "gpu", ["n1:0", "n1:1"], start, None, "llm-pretrain")
            _job(conn, cluster, s.alice_done, "alice", "ml", "gpu", [f"n2:{i}" for i in range(4)],
                 _t(4, 10), _t(4, 14), "finetune")
            _job(conn, cluster, s.bob_idle, "bob", "physics", "gpu", [f"n{n}:{i}" for n in (3, 4) for i in range(4)],
                 _t(4, 22), _t(5, 2), "notebook")
            _job(conn, cluster, s.bob_debug, "bob", "physics", "debug", ["n5:0"], _t(3, 20), _t(4, 4), "debug")
            _summary(conn, cluster, s.alice_done, 4, 4, 80.0, 4.0, [])
            _summary(conn, cluster, s.bob_idle, 8, 4, 3.0, 2.0, ["idle"])
            _summary(conn, cluster, s.bob_debug, 1, 8, 20.0, 1.0, ["low_util"])
            _running_job_series(conn, cluster, s.running, start)
    return s


def _running_job_series(conn: psycopg.Connection[Any], cluster: str, job: str, start: dt.datetime) -> None:
    """30 minutes at 1 Hz on 2 GPUs, a step every second on 2 ranks, metrics, logs, one profile."""
    conn.execute(
        """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, util_gpu, util_mem,
                                    mem_used, mem_total, power_w, energy_j, temp_c, lost)
           SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'n1', g, 'GPU-' || g, 'NVIDIA H100',
                  50 + 40 * sin(t / 60.0 + g), 30, (20 + g) * 2^30, 80 * 2^30, 300 + g * 50, t * 300.0, 55 + g, false
           FROM generate_series(0, 1799) t, generate_series(0, 1) g""",
        {"c": cluster, "j": job, "s": start},
    )
    rebuild_minutes(conn, cluster, job)
    conn.execute(
        """INSERT INTO steps (cluster, job_id, ts, node, rank, pid, step, epoch, phase, duration_s, data_wait_s,
                              compute_s, samples)
           SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'n1', r, 1000 + r, t, t / 600, 'train',
                  CASE WHEN r = 1 THEN 0.9 ELSE 0.5 END, 0.05, 0.4, 32
           FROM generate_series(0, 1799) t, generate_series(0, 1) r""",
        {"c": cluster, "j": job, "s": start},
    )
    rebuild_steps(conn, cluster, job)
    conn.execute(
        """INSERT INTO metrics (cluster, job_id, ts, node, rank, pid, step, name, value)
           SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'n1', 0, 1000, t, m,
                  CASE m WHEN 'loss' THEN 5.0 / (1 + t / 100.0) ELSE 0.001 END
           FROM generate_series(0, 1799, 10) t, unnest(ARRAY['loss', 'lr']) m""",
        {"c": cluster, "j": job, "s": start},
    )
    logs = [(10, 0, "INFO", "starting training"), (400, 1, "WARNING", "slow data loader on rank 1"),
            (900, 0, "ERROR", "loss spike detected"), (1200, 1, "INFO", "checkpoint saved")]
    for offset, rank, level, message in logs:
        conn.execute(
            """INSERT INTO log_events (cluster, job_id, ts, node, rank, pid, tid, thread, level, logger, message)
               VALUES (%s, %s, %s, 'n1', %s, %s, %s, 'MainThread', %s, 'train', %s)""",
            (cluster, job, start + dt.timedelta(seconds=offset), rank, 1000 + rank, 5000 + rank, level, message),
        )
    trace = gzip.compress(json.dumps({"traceEvents": []}).encode())
    for rank in (0, 1):
        conn.execute(
            """INSERT INTO profiles (cluster, job_id, ts, node, rank, pid, profile_id, step_start, step_end, summary,
                                     diagnosis, trace_gz)
               VALUES (%s, %s, %s, 'n1', %s, %s, 'prof-1', 600, 610, %s, %s, %s)""",
            (cluster, job, start + dt.timedelta(seconds=611), rank, 1000 + rank,
             # The shape agent/training/profiling.py uploads.
             Jsonb({"ops_by_self_device": [{"name": "aten::mm", "self_device_us": 120e3, "calls": 40},
                                           {"name": "aten::copy_", "self_device_us": 45e3 + 30e3 * rank, "calls": 80}],
                    "breakdown": {"basis": "device", "window_us": 8e6, "compute_us": 4e6,
                                  "communication_us": 1e6 + rank * 1e6, "data_loading_us": 0.5e6 + 2e6 * rank,
                                  "memcpy_us": 0.0, "idle_us": 0.0, "comm_overlap": None}}),
             Jsonb([{"rule": "input_bound", "message": "Rank 1 waits on the data loader for 40 % of each step."}]),
             trace),
        )


@dataclass(frozen=True)
class BigJob:
    """A running many-GPU job written by :func:`seed_big_job`, with its known outliers."""

    cluster: str
    job_id: str
    nodes: int
    gpus_per_node: int
    seconds: int
    straggler: int
    """The rank slow for the whole run (0.9 s a step against about 0.5 s): the rule's straggler."""
    spike: int
    """The rank that stalls for one minute (3 s steps) and is normal otherwise: far outside the band."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def seed_big_job(conn: psycopg.Connection[Any], cluster: str, job_id: str, *, nodes: int, gpus_per_node: int = 8,
                 seconds: int = 1800, end: dt.datetime | None = None) -> BigJob:
    """A running job on ``nodes`` × ``gpus_per_node`` GPUs, one rank per GPU: ``seconds`` of 1 Hz
    samples on every GPU and a step a second on every rank up to ``end`` (now), the per-minute
    rollups (GPUs and steps) and epoch starts rebuilt as the ingest path would have them, and
    loss/lr metrics from rank 0.

    Step times are 0.5 s with a small per-rank wobble; rank ``gpus // 2 + 1`` is slow all along
    (a straggler by the rule) and rank ``gpus // 4`` stalls for one minute a third of the way in.
    """
    gpus = nodes * gpus_per_node
    big = BigJob(cluster, job_id, nodes, gpus_per_node, seconds, straggler=gpus // 2 + 1, spike=gpus // 4)
    end = (end or dt.datetime.now(UTC)).replace(microsecond=0)
    start = end - dt.timedelta(seconds=seconds)
    keeper = PartitionKeeper()
    for table in PARTITIONED_TABLES:
        keeper.ensure(conn, table, {start.date(), end.date()})
    node_names = [f"{job_id}-n{n:03d}" for n in range(nodes)]
    params = {"c": cluster, "j": job_id, "s": start, "last": seconds - 1, "gpus": gpus, "per": gpus_per_node,
              "prefix": f"{job_id}-n", "straggler": big.straggler, "spike": big.spike,
              "spike_from": seconds // 3, "spike_to": seconds // 3 + 60}
    with conn.transaction():
        conn.execute(
            """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count, gpus,
                                 start_time, state, last_seen)
               VALUES (%s, %s, 'alice', 'ml', 'gpu', 'big-pretrain', %s, %s, %s, %s, 'running', %s)""",
            (cluster, job_id, node_names, nodes, [f"{n}:{g}" for n in node_names for g in range(gpus_per_node)],
             start, end),
        )
        conn.execute(
            """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, util_gpu, util_mem,
                                        mem_used, mem_total, power_w, energy_j, temp_c, lost)
               SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), %(prefix)s || lpad((g / %(per)s)::text, 3, '0'),
                      (g %% %(per)s)::int2, 'GPU-' || g, 'NVIDIA H100', 60 + 35 * sin(t / 90.0 + g), 40,
                      (40 + g %% 8) * 2^30, 80 * 2^30, 500 + (g %% 8) * 10, t * 500.0, 60 + g %% 8, false
               FROM generate_series(0, %(last)s) t, generate_series(0, %(gpus)s - 1) g""",
            params,
        )
        rebuild_minutes(conn, cluster, job_id)
        conn.execute(
            """INSERT INTO steps (cluster, job_id, ts, node, rank, pid, step, epoch, phase, duration_s, data_wait_s,
                                  compute_s, samples)
               SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), %(prefix)s || lpad((r / %(per)s)::text, 3, '0'),
                      r, 1000 + r, t, t / 600, 'train',
                      CASE WHEN r = %(straggler)s THEN 0.9
                           WHEN r = %(spike)s AND t >= %(spike_from)s AND t < %(spike_to)s THEN 3.0
                           ELSE 0.5 + 0.02 * sin(t / 30.0 + r) END,
                      0.05, 0.4, 32
               FROM generate_series(0, %(last)s) t, generate_series(0, %(gpus)s - 1) r""",
            params,
        )
        rebuild_steps(conn, cluster, job_id)
        conn.execute(
            """INSERT INTO metrics (cluster, job_id, ts, node, rank, pid, step, name, value)
               SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), %(prefix)s || '000', 0, 1000, t, m,
                      CASE m WHEN 'loss' THEN 5.0 / (1 + t / 100.0) ELSE 0.001 END
               FROM generate_series(0, %(last)s, 10) t, unnest(ARRAY['loss', 'lr']) m""",
            params,
        )
    for table in ("gpu_samples", "gpu_minutes", "steps", "step_minutes", "metrics"):
        conn.execute(f"ANALYZE {table}")
    return big
