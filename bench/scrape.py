"""What one scrape of the jobs' exposition (``GET /metrics/jobs``) costs on a 2,000-node cluster:
2,000 nodes x 8 GPUs of running jobs (500 jobs of 4 nodes, 32 ranks each).

    python bench/scrape.py                 # 500 jobs x 4 nodes x 8 GPUs, 5 minutes of hot samples
    python bench/scrape.py --jobs 50       # a quick look

A fresh embedded PostgreSQL gets, in SQL, what ingest would have left in the hot tier: a GPU sample
every 5 s per GPU over the last ``--minutes``, the step minutes of every rank, the hourly GPU rollup
and a host sample per node and 10 s; some open findings. The scrape is what the route does (the read
of the running jobs' latest values and the text), timed in this process, median of ``--repeat``; the
energy read (which the route caches for ``exposition.energy_refresh_s``) is timed apart. The baseline,
measured in the same run on the same rows: the bare SELECT of every GPU's latest sample (the one
statement a scrape cannot do without). Printed: times, the ratio scrape / baseline, series and bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobsight.collector.api.job_exposition_text import Rendered, render  # noqa: E402
from jobsight.collector.query.job_exposition import GPUS_LATEST, read_energy, read_jobs_now  # noqa: E402
from jobsight.collector.store import migrate  # noqa: E402
from jobsight.collector.store.embedded_db import EmbeddedPostgres  # noqa: E402
from jobsight.collector.store.partitions import PartitionKeeper  # noqa: E402

NODES_PER_JOB, GPUS, RANKS = 4, 8, 32
T = TypeVar("T")
WINDOW_S = 120.0

_JOBS = """
INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, node_count, start_time, state, last_seen)
SELECT 'default', 'j' || j, 'user' || (j %% 40), 'acct' || (j %% 7), 'part' || (j %% 3), 'train-' || j, 4,
       now() - interval '2 hours', 'running', now()
FROM generate_series(1, %(jobs)s) j
"""

_SAMPLES = """
INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, util_gpu, util_mem, mem_used, mem_total,
                         power_w, energy_j, temp_c, sm_clock_mhz, throttle_reasons, lost)
SELECT 'default', 'j' || j, t, 'node' || (j * 4 + n), g, 'GPU-' || j || '-' || n || '-' || g,
       CASE WHEN j %% 10 = 0 THEN 0 ELSE 70 + (j + g) %% 25 END, 30, 40e9, 80e9, 400 + g, 1e6, 60, 1980,
       CASE WHEN g = 0 THEN 4 ELSE 0 END, false
FROM generate_series(1, %(jobs)s) j, generate_series(0, 3) n, generate_series(0, 7) g,
     generate_series(now() - make_interval(secs => %(minutes)s * 60), now(), interval '5 seconds') t
"""

_STEPS = """
INSERT INTO step_minutes (cluster, job_id, ts, rank, steps, duration_sum, duration_max, data_wait_sum, last_step,
                          first_ts, last_ts)
SELECT 'default', 'j' || j, m, r, 120, 60.0, 0.55, 1.2, 1000, m, m + interval '59 seconds'
FROM generate_series(1, %(jobs)s) j, generate_series(0, 31) r,
     generate_series(date_trunc('minute', now()) - interval '2 minutes', date_trunc('minute', now()),
                     interval '1 minute') m
"""

_HOURS = """
INSERT INTO gpu_hours (cluster, job_id, ts, node, gpu_index, mig_uuid, gpu_uuid, samples, util_gpu_sum, util_gpu_n,
                       util_gpu_max, util_idle_n, util_mem_sum, util_mem_n, mem_used_max, mem_total_max, power_sum,
                       power_n, temp_sum, temp_n, energy_min, energy_max, energy_n, first_ts, last_ts, lost)
SELECT 'default', 'j' || j, h, 'node' || (j * 4 + n), g, '', 'GPU-' || j || '-' || n || '-' || g, 720, 720 * 80, 720,
       95, 0, 720 * 30, 720, 40e9, 80e9, 720 * 400, 720, 720 * 60, 720, 0, 1.4e6, 720, h,
       h + interval '59 minutes', false
FROM generate_series(1, %(jobs)s) j, generate_series(0, 3) n, generate_series(0, 7) g,
     generate_series(date_trunc('hour', now()) - interval '2 hours', date_trunc('hour', now()), interval '1 hour') h
"""

_HOST = """
INSERT INTO host_samples (cluster, job_id, ts, node, cpu_util, energy_j)
SELECT 'default', 'j' || j, t, 'node' || (j * 4 + n), 100, 1500
FROM generate_series(1, %(jobs)s) j, generate_series(0, 3) n,
     generate_series(now() - make_interval(secs => %(minutes)s * 60), now(), interval '10 seconds') t
"""

_FINDINGS = """
INSERT INTO findings (cluster, job_id, rule, subject, severity, state, opened_at, updated_at, title, message, evidence)
SELECT 'default', 'j' || j, 'idle_gpus', '', 'warning', 'open', now(), now(), 'idle', 'idle', '{}'
FROM generate_series(10, %(jobs)s, 10) j
"""


def seed(conn: psycopg.Connection[dict[str, object]], jobs: int, minutes: float) -> None:
    keeper = PartitionKeeper()
    keeper.load(conn)
    today = dt.datetime.now(dt.UTC).date()
    days = [today - dt.timedelta(days=1), today, today + dt.timedelta(days=1)]
    for table in ("gpu_samples", "step_minutes", "gpu_hours", "host_samples"):
        keeper.ensure(conn, table, days)
    params = {"jobs": jobs, "minutes": minutes}
    for sql in (_JOBS, _SAMPLES, _STEPS, _HOURS, _HOST, _FINDINGS):
        conn.execute(sql, params)
    conn.execute("ANALYZE")


def timed(repeat: int, work: Callable[[], T]) -> tuple[float, T]:
    """The median wall time of ``repeat`` calls of ``work``, and its last answer."""
    walls = []
    for _ in range(repeat):
        began = time.perf_counter()
        result = work()
        walls.append(time.perf_counter() - began)
    return statistics.median(walls), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobsight-bench-scrape-") as work:
        server = EmbeddedPostgres(Path(work) / "pg")
        url = server.start()
        try:
            migrate.upgrade(url)
            with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
                began = time.perf_counter()
                seed(conn, args.jobs, args.minutes)
                gpus = args.jobs * NODES_PER_JOB * GPUS
                print(f"seeded {args.jobs} running jobs: {args.jobs * NODES_PER_JOB} nodes x {GPUS} GPUs = "
                      f"{gpus} GPUs, {RANKS} ranks each, {args.minutes:g} min of hot samples, "
                      f"in {time.perf_counter() - began:.1f} s")
                energy_s, energy = timed(args.repeat, lambda: read_energy(conn))
                since = {"since": dt.datetime.now(dt.UTC) - dt.timedelta(seconds=WINDOW_S)}
                base_s, rows = timed(args.repeat, lambda: conn.execute(GPUS_LATEST, since).fetchall())

                def scrape() -> Rendered:
                    now = read_jobs_now(conn, dt.datetime.now(dt.UTC), WINDOW_S)
                    return render(now, energy, 1e-4, 10_000_000, 0)

                scrape_s, rendered = timed(args.repeat, scrape)
        finally:
            server.destroy()
    body = rendered.text.encode()
    print(f"baseline, the bare SELECT of every GPU's latest sample ({len(rows)} rows): {base_s * 1000:.0f} ms")
    print(f"scrape (read + text): {scrape_s * 1000:.0f} ms, {rendered.series} series, "
          f"{len(body) / 1e6:.1f} MB ({len(gzip.compress(body)) / 1e6:.2f} MB gzipped)")
    print(f"energy read (cached between scrapes): {energy_s * 1000:.0f} ms for {len(energy)} jobs")
    print(f"ratio scrape / baseline: {scrape_s / base_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
