"""The job page's queries on a 64-GPU job with ~5 M samples return chart-sized series.

Points, not timings, are asserted (timings are bench/dashboard.py's business).
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.query import series as queries
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers.rollup import rebuild_minutes
from tests.conftest import own_database

GPUS, NODES = 64, 8
TICKS = 78_125  # × 64 GPUs = 5,000,000 samples at 1 Hz, about 21.7 hours
START = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
JOB = "scale-5m"


def fill_gpu_samples(conn: psycopg.Connection[Any], cluster: str, job: str, start: dt.datetime, ticks: int,
                     gpus: int = GPUS, nodes: int = NODES) -> None:
    """``gpus`` GPUs over ``nodes`` nodes sampled every second for ``ticks`` seconds, in SQL."""
    end = start + dt.timedelta(seconds=ticks)
    keeper = PartitionKeeper()
    days = {(start + dt.timedelta(days=n)).date() for n in range((end - start).days + 2)}
    keeper.ensure(conn, "gpu_samples", days)
    keeper.ensure(conn, "gpu_minutes", days)
    per_node = gpus // nodes
    conn.execute(
        """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, util_gpu, mem_used, power_w, temp_c)
           SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'node' || (g / %(per)s), (g %% %(per)s)::int2,
                  'GPU-' || g, (t %% 100)::float8, 1073741824::bigint * (g %% 8), 300 + (t %% 50), 60
           FROM generate_series(0, %(ticks)s - 1) t, generate_series(0, %(gpus)s - 1) g""",
        {"c": cluster, "j": job, "s": start, "per": per_node, "ticks": ticks, "gpus": gpus},
    )
    conn.execute(
        """INSERT INTO jobs (cluster, job_id, user_name, gpus, start_time, end_time, state)
           VALUES (%s, %s, 'scale', %s, %s, %s, 'completed')""",
        (cluster, job, [f"node{g // per_node}:{g % per_node}" for g in range(gpus)], start, end),
    )
    # As the ingest path would have: the per-minute rollup that wide charts read.
    rebuild_minutes(conn, cluster, job)
    conn.execute("ANALYZE gpu_samples")
    conn.execute("ANALYZE gpu_minutes")


@pytest.fixture(scope="module")
def five_million(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A database of its own, so 5 M rows neither slow nor outlive the other tests."""
    for url in own_database(postgres, "scale"):
        began = time.monotonic()
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            fill_gpu_samples(conn, "default", JOB, START, TICKS)
            assert conn.execute("SELECT count(*) AS n FROM gpu_samples").fetchone()["n"] == GPUS * TICKS
        print(f"seeded {GPUS * TICKS:,} samples in {time.monotonic() - began:.1f} s")
        yield url


@pytest.mark.timeout(600)
@pytest.mark.parametrize("points", [600, 2000])
def test_gpu_series_returns_at_most_points_per_gpu(five_million: str, points: int) -> None:
    with psycopg.connect(five_million, row_factory=dict_row) as conn:
        rows = queries.gpu_series(conn, "default", JOB, points=points)
    per_gpu = Counter((r["node"], r["gpu_index"]) for r in rows)
    assert len(per_gpu) == GPUS
    assert max(per_gpu.values()) <= points
    assert min(per_gpu.values()) >= points * 0.95  # the whole run is covered, not a slice of it
    assert sum(r["samples"] for r in rows) == GPUS * TICKS  # every sample lands in exactly one bucket
    assert len(rows) <= GPUS * points


@pytest.mark.timeout(600)
def test_a_window_is_downsampled_too(five_million: str) -> None:
    window = (START + dt.timedelta(hours=1), START + dt.timedelta(hours=2))
    with psycopg.connect(five_million, row_factory=dict_row) as conn:
        rows = queries.gpu_series(conn, "default", JOB, start=window[0], end=window[1], points=300)
    per_gpu = Counter((r["node"], r["gpu_index"]) for r in rows)
    assert len(per_gpu) == GPUS and max(per_gpu.values()) <= 300
    assert all(window[0] <= r["bucket"] <= window[1] for r in rows)
