"""Dashboard query times on 5 M and 50 M sample tables, and their ratio to a plain count(*).

    python bench/dashboard.py                 # 5 M and 50 M samples (50 M takes a while to seed)
    python bench/dashboard.py --sizes 1e6     # a quick look

Each size gets a fresh database on an embedded PostgreSQL: one 64-GPU job sampled at 1 Hz
(5 M ≈ 22 h, 50 M ≈ 9 days). The job page is the queries the page makes (job row, GPU
series at 600 points, markers); the audit is totals, GPU-hours by user/account/partition
and the daily trend over the job's run. The ratio compares each with
``SELECT count(*) FROM gpu_samples WHERE job_id = …`` on the same job: the least any
query that reads the job's samples must do.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobsight.collector import audit_queries, migrate, profile_queries, queries  # noqa: E402
from jobsight.collector.embedded_db import EmbeddedPostgres  # noqa: E402
from tests.dashboard.test_query_scale import GPUS, fill_gpu_samples  # noqa: E402

START = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
JOB, CLUSTER = "bench", "default"


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of ``repeat`` runs after one warm-up, in seconds."""
    fn()
    runs = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - began)
    return statistics.median(runs)


def job_page(conn: psycopg.Connection[Any]) -> None:
    queries.get_job(conn, CLUSTER, JOB)
    queries.gpu_series(conn, CLUSTER, JOB, points=600)
    queries.step_series(conn, CLUSTER, JOB, points=600)
    queries.metric_series(conn, CLUSTER, JOB, points=600)
    queries.log_events(conn, CLUSTER, JOB, level="WARNING", limit=200)
    queries.epoch_starts(conn, CLUSTER, JOB)
    profile_queries.profile_windows(conn, CLUSTER, JOB)


def audit(conn: psycopg.Connection[Any], end: dt.datetime) -> None:
    audit_queries.audit_totals(conn, START, end)
    for group in ("user_name", "account", "partition"):
        audit_queries.gpu_hours_by(conn, group, START, end)  # type: ignore[arg-type]
    audit_queries.underused_allocations(conn, START, end, below_percent=30)
    audit_queries.daily_trend(conn, START, end)


def bench(server: EmbeddedPostgres, samples: int, repeat: int) -> None:
    name = f"bench_{samples}"
    admin = server.url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.url.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)
    ticks = samples // GPUS
    began = time.monotonic()
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        fill_gpu_samples(conn, CLUSTER, JOB, START, ticks)
        seeded = time.monotonic() - began
        end = START + dt.timedelta(seconds=ticks)
        count = timed(lambda: conn.execute("SELECT count(*) FROM gpu_samples WHERE job_id = %s", (JOB,)).fetchone(),
                      repeat)
        page = timed(lambda: job_page(conn), repeat)
        report = timed(lambda: audit(conn, end), repeat)
    print(f"{GPUS * ticks:>12,} samples (seeded in {seeded:.0f} s): count(*) {count * 1000:8.1f} ms | "
          f"job page {page * 1000:8.1f} ms ({page / count:.2f}× count) | "
          f"audit {report * 1000:7.1f} ms ({report / count:.3f}× count)", flush=True)
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
            for size in (int(float(s)) for s in args.sizes.split(",")):
                bench(server, size, args.repeat)
        finally:
            server.destroy()


if __name__ == "__main__":
    main()
