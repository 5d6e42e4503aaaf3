"""What the health evaluator costs: one evaluation of 500 running jobs of 8 GPUs and 8 ranks,
against its default interval.

    python bench/health.py                  # 500 jobs, 3 hours of rollups each
    python bench/health.py --jobs 100       # a quick look

A fresh embedded PostgreSQL gets, in SQL, what ingest would have left: per rank and minute step
sums (``step_minutes``), per GPU and minute and hour sums (``gpu_minutes``, ``gpu_hours``) over
the last ``--hours``; 10 % of the jobs have idle GPUs and 5 % a slow rank, so findings open on
the first evaluation and are updated by each one after. The figure is the median wall time of
an evaluation (the evaluator's Python and PostgreSQL's work for it: they take turns on one
connection) divided by the default interval (``JOBSIGHT_HEALTH_INTERVAL_S``, 60 s): the share
of one core the evaluator keeps busy. The issue's bound is 10 %.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobsight.collector.config.health import load_health_settings  # noqa: E402
from jobsight.collector.passes.findings import HealthEvaluator  # noqa: E402
from jobsight.collector.store import migrate  # noqa: E402
from jobsight.collector.store.embedded_db import EmbeddedPostgres  # noqa: E402
from jobsight.collector.store.partitions import PartitionKeeper  # noqa: E402

GPUS = RANKS = 8

_JOBS = """
INSERT INTO jobs (cluster, job_id, user_name, account, partition, node_count, start_time, state, last_seen)
SELECT 'default', 'j' || j, 'user' || (j %% 40), 'acct' || (j %% 7), 'gpu', 1, %(start)s, 'running', now()
FROM generate_series(1, %(jobs)s) j
"""

# Rank 3 of every 20th job works 60 % longer per step; the others step at 0.5 s.
_STEPS = """
INSERT INTO step_minutes (cluster, job_id, ts, rank, steps, duration_sum, duration_max, data_wait_sum, samples_sum,
                          last_step, epoch, first_ts, last_ts, forward_sum, forward_n)
SELECT 'default', 'j' || j, m, r, 120, 60.0, 0.55, 1.2, 3840, extract(epoch FROM m)::bigint, 0, m,
       m + interval '59.5 seconds', CASE WHEN j %% 20 = 0 AND r = 3 THEN 38.4 ELSE 24.0 END, 120
FROM generate_series(1, %(jobs)s) j, generate_series(0, %(ranks)s - 1) r,
     generate_series(date_trunc('minute', %(start)s::timestamptz), date_trunc('minute', now()), interval '1 minute') m
"""

# Every 10th job's GPUs are idle; the rest busy at 70-95 %.
_GPU_MINUTES = """
INSERT INTO gpu_minutes (cluster, job_id, ts, node, gpu_index, mig_uuid, gpu_uuid, samples, util_gpu_sum, util_gpu_n,
                         util_gpu_max, util_idle_n, util_mem_sum, util_mem_n, mem_used_max, mem_total_max, power_sum,
                         power_n, temp_sum, temp_n, energy_min, energy_max, energy_n, first_ts, last_ts, lost)
SELECT 'default', 'j' || j, m, 'node' || j, g, '', 'GPU-' || j || '-' || g, 60, 60 * u, 60, u, 0, 60 * 30, 60,
       40e9, 80e9, 60 * 400, 60, 60 * 50, 60, 0, 24000, 60, m, m + interval '59 seconds', false
FROM generate_series(1, %(jobs)s) j, generate_series(0, %(gpus)s - 1) g,
     generate_series(date_trunc('minute', %(start)s::timestamptz), date_trunc('minute', now()), interval '1 minute') m,
     LATERAL (SELECT CASE WHEN j %% 10 = 0 THEN 1.0 ELSE 70 + (j + g) %% 25 END AS u) x
"""

_GPU_HOURS = """
INSERT INTO gpu_hours
SELECT cluster, job_id, date_trunc('hour', ts), node, gpu_index, mig_uuid, gpu_uuid, sum(samples), sum(util_gpu_sum),
       sum(util_gpu_n), max(util_gpu_max), sum(util_idle_n), sum(util_mem_sum), sum(util_mem_n), max(mem_used_max),
       max(mem_total_max), sum(power_sum), sum(power_n), sum(temp_sum), sum(temp_n), min(energy_min), max(energy_max),
       sum(energy_n), min(first_ts), max(last_ts), bool_or(lost)
FROM gpu_minutes GROUP BY cluster, job_id, date_trunc('hour', ts), node, gpu_index, mig_uuid, gpu_uuid
"""


def seed(conn: psycopg.Connection[dict[str, object]], jobs: int, hours: float) -> None:
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)
    keeper = PartitionKeeper()
    keeper.load(conn)
    span = (dt.datetime.now(dt.UTC).date() - start.date()).days + 2
    days = [start.date() + dt.timedelta(days=d) for d in range(span)]
    for table in ("step_minutes", "gpu_minutes", "gpu_hours"):
        keeper.ensure(conn, table, days)
    params = {"jobs": jobs, "ranks": RANKS, "gpus": GPUS, "start": start}
    for sql in (_JOBS, _STEPS, _GPU_MINUTES):
        conn.execute(sql, params)
    conn.execute(_GPU_HOURS)
    conn.execute("ANALYZE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    settings = load_health_settings()
    with tempfile.TemporaryDirectory(prefix="jobsight-bench-health-") as work:
        server = EmbeddedPostgres(Path(work) / "pg")
        url = server.start()
        try:
            migrate.upgrade(url)
            with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
                began = time.perf_counter()
                seed(conn, args.jobs, args.hours)
                print(f"seeded {args.jobs} running jobs × {GPUS} GPUs × {RANKS} ranks, {args.hours:g} h of rollups "
                      f"in {time.perf_counter() - began:.1f} s")
                evaluator = HealthEvaluator(settings)
                first = evaluator.evaluate_once(conn)
                print(f"first evaluation: {first.jobs} jobs, {len(first.opened)} findings opened "
                      f"({', '.join(sorted({f['rule'] for f in first.opened}))})")
                walls, cpus = [], []
                for _ in range(args.repeat):
                    wall, cpu = time.perf_counter(), time.process_time()
                    result = evaluator.evaluate_once(conn)
                    walls.append(time.perf_counter() - wall)
                    cpus.append(time.process_time() - cpu)
                assert not result.opened, "a steady state opens nothing"
        finally:
            server.destroy()
    wall = statistics.median(walls)
    print(f"evaluation: {wall * 1000:.0f} ms wall (of which {statistics.median(cpus) * 1000:.0f} ms the evaluator's "
          f"own CPU), {result.updated} findings updated")
    print(f"ratio evaluation / interval ({settings.interval_s:g} s): {wall / settings.interval_s:.4f} "
          f"({100 * wall / settings.interval_s:.2f} % of one core; bound 10 %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
