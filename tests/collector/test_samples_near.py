"""``reads.samples_near``: a job's samples within a window of any of many times, from both tiers,
read once for all of them, are exactly the samples a filter over all of them keeps: windows across
hour edges, at the first and last sample, overlapping, and late samples still in the hot tier."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction
from jobsight.collector.tiers import reads as tiers
from tests.conftest import own_database

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (the dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CLUSTER = "default"
DAY = dt.date.today() - dt.timedelta(days=30)
T0 = dt.datetime.combine(DAY, dt.time(9, 58), dt.UTC)
TICKS = 3 * 3600
NEAR = dt.timedelta(seconds=10)


@pytest.fixture(scope="module")
def job(postgres: EmbeddedPostgres) -> Iterator[tuple[str, str]]:
    """A 2-GPU job of three hours at 1 Hz from 09:58, packed, and a late sample in the hot tier."""
    for url in own_database(postgres, "near"):
        job_id = f"near-{uuid.uuid4().hex[:8]}"
        with psycopg.connect(url, autocommit=True) as conn:
            for table in ("gpu_samples", "gpu_minutes"):
                PartitionKeeper().ensure(conn, table, [DAY])
            conn.execute(
                """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, energy_j)
                   SELECT %s, %s, %s + make_interval(secs => t) + g * interval '1 millisecond', 'n1', g,
                          'GPU-' || g, 1e6 + t * 600 + g
                   FROM generate_series(0, %s - 1) t, generate_series(0, 1) g""", (CLUSTER, job_id, T0, TICKS))
            compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)
            PartitionKeeper().ensure(conn, "gpu_samples", [DAY])
            conn.execute("INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, energy_j) "
                         "VALUES (%s, %s, %s, 'n1', 0, 'GPU-0', 7)", (CLUSTER, job_id, T0 + dt.timedelta(hours=1)))
        yield url, job_id


def _all(conn: psycopg.Connection[Any], job_id: str) -> list[dict[str, Any]]:
    return conn.execute(f"SELECT * FROM {tiers.samples(['energy_j'])} s",
                        {"job": job_id, "cluster": CLUSTER}).fetchall()


def _near(conn: psycopg.Connection[Any], job_id: str, times: list[dt.datetime],
          near: dt.timedelta) -> list[dict[str, Any]]:
    query = tiers.samples_near(["energy_j"], times="%(times)s::timestamptz[]", near="%(near)s")
    return conn.execute(f"SELECT * FROM {query} s",
                        {"job": job_id, "cluster": CLUSTER, "times": times, "near": near}).fetchall()


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(repr(row[c]) for c in (*tiers.SAMPLE_KEY, "energy_j"))


EDGES = [T0, T0 + dt.timedelta(minutes=2), T0 + dt.timedelta(hours=1, minutes=2, seconds=5),
         T0 + dt.timedelta(seconds=TICKS - 1), T0 + dt.timedelta(hours=5)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(offsets=st.lists(st.one_of(st.integers(-60_000, (TICKS + 60) * 1000), st.sampled_from(
    [int((t - T0).total_seconds() * 1000) for t in EDGES])), min_size=1, max_size=12),
       near=st.sampled_from([NEAR, dt.timedelta(minutes=50)]))
def test_the_samples_near_any_time_are_those_a_filter_keeps(job: tuple[str, str], offsets: list[int],
                                                            near: dt.timedelta) -> None:
    """Epoch energy's 10 s, and windows longer than an hour (three hours touched by one)."""
    url, job_id = job
    times = sorted({T0 + dt.timedelta(milliseconds=ms) for ms in offsets})
    with psycopg.connect(url, row_factory=dict_row) as conn:
        everything = _all(conn, job_id)
        found = _near(conn, job_id, times, near)
    wanted = [r for r in everything if any(abs(r["ts"] - t) <= near for t in times)]
    assert sorted(map(_key, found)) == sorted(map(_key, wanted))


def test_a_window_across_three_hours_reads_the_middle_one(job: tuple[str, str]) -> None:
    """10:30 ± 50 min touches 09:00, 10:00 and 11:00: the middle hour's blocks are read too."""
    url, job_id = job
    at, near = dt.datetime.combine(DAY, dt.time(10, 30), dt.UTC), dt.timedelta(minutes=50)
    with psycopg.connect(url, row_factory=dict_row) as conn:
        found = _near(conn, job_id, [at], near)
        wanted = [r for r in _all(conn, job_id) if abs(r["ts"] - at) <= near]
    assert len(wanted) > 2 * 3600
    assert sorted(map(_key, found)) == sorted(map(_key, wanted))
