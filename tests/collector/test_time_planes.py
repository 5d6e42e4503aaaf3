"""Packed sample times in byte planes (migration 0018): every time of a GPU timeline and of a host
block reads back to the microsecond, a 1 Hz series costs a few bytes a tick, and blocks packed
before (times in ``sample_ts``) read alike and are repacked in planes by a late sample."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.packed_params import TIME_PLANES
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction, host_tier
from jobsight.collector.tiers import reads as tiers
from tests.conftest import own_database

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (the dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CLUSTER = "default"
DAY = dt.date.today() - dt.timedelta(days=30)
HOUR = dt.datetime.combine(DAY, dt.time(10), dt.UTC)
LAST_US = 3600 * 10**6 - 1


@pytest.fixture(scope="module")
def url(postgres: EmbeddedPostgres) -> Iterator[str]:
    yield from own_database(postgres, "times")


def _pass(conn: psycopg.Connection[Any]) -> None:
    compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)


def _insert(conn: psycopg.Connection[Any], job: str, node: str, gpus: int, times: list[dt.datetime]) -> None:
    """Samples of ``gpus`` GPUs of ``node`` (sharing a timeline) and its host, at ``times``."""
    for table in ("gpu_samples", "gpu_minutes", "host_samples"):
        PartitionKeeper().ensure(conn, table, [DAY])
    conn.execute(
        """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, util_gpu)
           SELECT %(cluster)s, %(job)s, t, %(node)s, g, 'GPU-' || %(node)s || g, 50 + g
           FROM unnest(%(times)s::timestamptz[]) t, generate_series(0, %(gpus)s - 1) g""",
        {"cluster": CLUSTER, "job": job, "node": node, "gpus": gpus, "times": times})
    conn.execute(
        """INSERT INTO host_samples (cluster, job_id, ts, node, cpu_util)
           SELECT %(cluster)s, %(job)s, t, %(node)s, 100 FROM unnest(%(times)s::timestamptz[]) t""",
        {"cluster": CLUSTER, "job": job, "node": node, "times": times})


def _times(conn: psycopg.Connection[Any], job: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every GPU sample's (node, GPU, time) and host sample's (node, time), from both tiers."""
    params = {"job": job, "cluster": CLUSTER}
    gpu = conn.execute(f"SELECT node, gpu_index, ts FROM {tiers.samples(['util_gpu'])} s", params).fetchall()
    host = conn.execute(f"SELECT node, ts FROM {host_tier.samples()} s", params).fetchall()
    return {"gpu": sorted(tuple(r.values()) for r in gpu), "host": sorted(tuple(r.values()) for r in host)}


def _stored(conn: psycopg.Connection[Any], job: str) -> list[dict[str, Any]]:
    """How the job's timelines and host blocks keep their times: in ``sample_ts`` or in planes, and
    the bytes of each."""
    planes = " + ".join(f"coalesce(pg_column_size({p}), 0)" for p in TIME_PLANES)
    rows = []
    for table in ("gpu_sample_timelines", "host_sample_blocks"):
        rows += conn.execute(
            f"""SELECT %(table)s AS tbl, sample_ts IS NOT NULL AS whole, ts_s_p0 IS NOT NULL AS planes,
                       coalesce(cardinality(sample_ts), cardinality(ts_s_p0)) AS n, {planes} AS plane_bytes
                FROM {table} WHERE job_id = %(job)s""", {"table": table, "job": job}).fetchall()
    return rows


OFFSETS = st.lists(st.one_of(st.integers(0, LAST_US), st.sampled_from([0, 1, 999_999, 10**6, LAST_US])),
                   min_size=1, max_size=40)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_a=OFFSETS, node_b=OFFSETS)
def test_random_times_come_back(url: str, node_a: list[int], node_b: list[int]) -> None:
    """Any times in an hour, its first and last microsecond and repeated times included, read back
    exactly from GPU timelines (shared by a node's GPUs) and host blocks, all kept in planes."""
    job = f"times-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        for node, offsets in (("a", node_a), ("b", node_b)):
            _insert(conn, job, node, 2, [HOUR + dt.timedelta(microseconds=us) for us in offsets])
        before = _times(conn, job)
        _pass(conn)
        assert conn.execute("SELECT count(*) AS n FROM gpu_samples WHERE job_id = %s", (job,)).fetchone()["n"] == 0
        assert _times(conn, job) == before
        assert {(r["whole"], r["planes"]) for r in _stored(conn, job)} == {(False, True)}


def test_a_1_hz_series_costs_a_few_bytes_a_tick(url: str) -> None:
    """An hour of ticks a few hundred microseconds late: the seconds count up and compress away, the
    lateness costs what it carries, well under the 8 bytes a timestamp takes."""
    job = f"ticks-{uuid.uuid4().hex[:8]}"
    ticks = [HOUR + dt.timedelta(seconds=t, microseconds=(t * 7919) % 1500) for t in range(3600)]
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _insert(conn, job, "n1", 8, ticks)
        before = _times(conn, job)
        _pass(conn)
        assert _times(conn, job) == before
        stored = _stored(conn, job)
    assert [(r["tbl"], r["n"]) for r in stored] == [("gpu_sample_timelines", 3600), ("host_sample_blocks", 3600)]
    for row in stored:
        assert row["plane_bytes"] < 2.5 * 3600, row


def test_blocks_packed_before_time_planes_read_alike(empty_database_url: str) -> None:
    """Downgrading 0018 writes every block's times back into ``sample_ts``, which is how blocks packed
    before are made here: they read alike, and a late sample repacks their job-hour in planes."""
    url = empty_database_url
    job = f"oldtimes-{uuid.uuid4().hex[:8]}"
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        ticks = [HOUR + dt.timedelta(seconds=s, microseconds=s * 997 % 10**6) for s in range(0, 3600, 7)]
        _insert(conn, job, "n1", 3, ticks)
        _insert(conn, job, "n2", 1, [HOUR, HOUR, HOUR + dt.timedelta(microseconds=LAST_US)])
        before = _times(conn, job)
        _pass(conn)
    migrate.downgrade(url, "0017")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        assert {(r["whole"], r["planes"]) for r in _stored(conn, job)} == {(True, False)}
        assert _times(conn, job) == before
        late = [HOUR + dt.timedelta(seconds=1.5)]
        _insert(conn, job, "n2", 1, late)
        _pass(conn)
        after = _times(conn, job)
        assert after["gpu"] == sorted([*before["gpu"], ("n2", 0, late[0])])
        assert after["host"] == sorted([*before["host"], ("n2", late[0])])
        kept = sorted((r["tbl"], r["n"], r["whole"], r["planes"]) for r in _stored(conn, job))
    # The pass repacks the whole job-hour it merges into: in planes.
    assert kept == [("gpu_sample_timelines", 4, False, True), ("gpu_sample_timelines", 515, False, True),
                    ("host_sample_blocks", 4, False, True), ("host_sample_blocks", 515, False, True)]
