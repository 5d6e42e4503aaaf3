"""Dashboard query times on 5 M and 50 M samples, hot and packed, and their ratio to a plain count(*).

    python bench/dashboard.py                 # 5 M and 50 M samples (about 10 minutes on 2 cores)
    python bench/dashboard.py --sizes 1e6     # a quick look

Each size gets a fresh database on an embedded PostgreSQL: one 64-GPU job sampled at 1 Hz
(5 M ≈ 22 h, 50 M ≈ 9 days), built in SQL with its per-minute rollup. The job page is the
queries the page makes (job row, the GPU heatmap's grid and the step band's at the dashboard's
default cell budget, metrics, warnings, markers); the audit is totals,
GPU-hours by user/account/partition and the daily trend over the job's run. Both are timed on
the hot tier (row per sample, as the job's last day is), then again after a compaction pass has
packed every day (as they are once the job is older than ``JOBSIGHT_HOT_DAYS``). The ratio
compares each with ``SELECT count(*) FROM gpu_samples WHERE job_id = …`` on the raw samples
(timed before the pass): the least any query that reads the job's samples must do.

The raw partitions are made UNLOGGED here, and the server's checkpoints spaced out, only to seed
faster: reads do not depend on either, and the packed tier is written logged as in production.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import median_time  # noqa: E402
from jobsight.collector.query import audit as audit_queries  # noqa: E402
from jobsight.collector.query import grids  # noqa: E402
from jobsight.collector.query import logs as log_queries  # noqa: E402
from jobsight.collector.query import profiles as profile_queries  # noqa: E402
from jobsight.collector.query import series as queries  # noqa: E402
from jobsight.collector.query.jobs import get_job  # noqa: E402
from jobsight.collector.store import migrate  # noqa: E402
from jobsight.collector.store.embedded_db import EmbeddedPostgres  # noqa: E402
from jobsight.collector.store.partitions import PartitionKeeper, partition_name  # noqa: E402
from jobsight.collector.tiers import compaction  # noqa: E402
from jobsight.dashboard.settings import DashboardSettings  # noqa: E402
from tests.dashboard.test_query_scale import GPUS, fill_gpu_samples  # noqa: E402

START = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
JOB, CLUSTER = "bench", "default"
TIERS = {
    "raw": ("gpu_samples", "gpu_minutes"),
    "packed": ("gpu_sample_blocks", "gpu_sample_timelines", "gpu_devices", "gpu_minute_blocks"),
}


def job_page(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():  # one unit of work, as the API and the dashboard read
        job_page_queries(conn)


PAGE = DashboardSettings()
"""The dashboard's default budgets: the page reads what they let it read."""


def job_page_queries(conn: psycopg.Connection[Any]) -> None:
    """The reads of the job page, as the dashboard makes them (its heatmap, step band and metric
    budgets), with the markers and the warnings the page shows."""
    get_job(conn, CLUSTER, JOB)
    grids.read_gpu_grid(conn, CLUSTER, JOB, PAGE.heatmap_cells, PAGE.chart_points)
    grids.read_step_grid(conn, CLUSTER, JOB, PAGE.heatmap_cells, PAGE.chart_points)
    grids.read_metric_grid(conn, CLUSTER, JOB, PAGE.line_points, PAGE.chart_points)
    log_queries.log_events(conn, CLUSTER, JOB, level="WARNING", limit=200)
    queries.epoch_starts(conn, CLUSTER, JOB)
    profile_queries.profile_windows(conn, CLUSTER, JOB)


def audit(conn: psycopg.Connection[Any], end: dt.datetime) -> None:
    audit_queries.audit_totals(conn, START, end)
    for group in ("user_name", "account", "partition"):
        audit_queries.gpu_hours_by(conn, group, START, end)  # type: ignore[arg-type]
    audit_queries.underused_allocations(conn, START, end, below_percent=30)
    audit_queries.daily_trend(conn, START, end)


def tier_bytes(conn: psycopg.Connection[Any], tier: str) -> int:
    row = conn.execute(
        """SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) AS n FROM pg_class c
           WHERE c.oid = ANY(%(t)s::regclass[]) OR c.oid IN (SELECT inhrelid FROM pg_inherits
                                                             WHERE inhparent = ANY(%(t)s::regclass[]))""",
        {"t": list(TIERS[tier])},
    ).fetchone()
    return int(row["n"]) if row else 0


def unlogged_partitions(conn: psycopg.Connection[Any], days: int) -> None:
    for n in range(days):
        day = START.date() + dt.timedelta(days=n)
        for table in ("gpu_samples", "gpu_minutes"):
            conn.execute(
                f"CREATE UNLOGGED TABLE {partition_name(table, day)} PARTITION OF {table} "
                f"FOR VALUES FROM ('{day} 00:00:00+00') TO ('{day + dt.timedelta(days=1)} 00:00:00+00')"
            )


def bench(server: EmbeddedPostgres, samples: int, repeat: int) -> None:
    name = f"bench_{samples}"
    admin = server.url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.url.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)
    ticks = samples // GPUS
    end = START + dt.timedelta(seconds=ticks)
    began = time.monotonic()
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        unlogged_partitions(conn, (end - START).days + 2)
        fill_gpu_samples(conn, CLUSTER, JOB, START, ticks)
        seeded = time.monotonic() - began
        count_query = "SELECT count(*) FROM gpu_samples WHERE job_id = %s"
        count = median_time(lambda: conn.execute(count_query, (JOB,)).fetchone(), repeat)
        hot_page = median_time(lambda: job_page(conn), repeat)
        hot_audit = median_time(lambda: audit(conn, end), repeat)
        raw_bytes = tier_bytes(conn, "raw")
        began = time.monotonic()
        compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)
        packed_in = time.monotonic() - began
        conn.execute("VACUUM ANALYZE")
        packed_page = median_time(lambda: job_page(conn), repeat)
        packed_audit = median_time(lambda: audit(conn, end), repeat)
        packed_bytes = tier_bytes(conn, "packed")
    total = GPUS * ticks
    print(f"{total:>12,} samples (seeded in {seeded:.0f} s, packed in {packed_in:.0f} s): "
          f"count(*) {count * 1000:7.1f} ms", flush=True)
    for tier, page, report, size in (("hot", hot_page, hot_audit, raw_bytes),
                                     ("packed", packed_page, packed_audit, packed_bytes)):
        print(f"    {tier:<7} job page {page * 1000:7.1f} ms ({page / count:.2f}× count) | "
              f"audit {report * 1000:6.1f} ms ({report / count:.3f}× count) | "
              f"{size / total:6.1f} B/sample all in", flush=True)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="5e6,5e7", help="comma-separated sample counts (default 5e6,5e7)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobsight-bench-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pg")
        server.start()
        try:
            with psycopg.connect(server.url, autocommit=True) as conn:  # fewer checkpoints while seeding
                conn.execute("ALTER SYSTEM SET max_wal_size = '16GB'")
                conn.execute("ALTER SYSTEM SET checkpoint_timeout = '30min'")
                conn.execute("SELECT pg_reload_conf()")
            for size in (int(float(s)) for s in args.sizes.split(",")):
                bench(server, size, args.repeat)
        finally:
            server.destroy()


if __name__ == "__main__":
    main()
