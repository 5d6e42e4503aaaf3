"""A GPU's energy counter in packed blocks (migration 0019): kept as differences from the previous
sample when the block has no NULL and its values span less than 2^31 (of its step: each
difference an int4), read back exactly (resets included); blocks packed before read alike."""

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
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction
from jobsight.collector.tiers import reads as tiers
from tests.conftest import own_database

CLUSTER = "default"
DAY = dt.date.today() - dt.timedelta(days=30)
T0 = dt.datetime.combine(DAY, dt.time(10), dt.UTC)


@pytest.fixture(scope="module")
def url(postgres: EmbeddedPostgres) -> Iterator[str]:
    yield from own_database(postgres, "counters")


def _pass(conn: psycopg.Connection[Any]) -> None:
    compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)


def _insert(conn: psycopg.Connection[Any], job: str, node: str, energy: list[float | None]) -> None:
    """One GPU's energy readings, a sample a second from T0."""
    for table in ("gpu_samples", "gpu_minutes"):
        PartitionKeeper().ensure(conn, table, [DAY])
    for i, joules in enumerate(energy):
        at = T0 + dt.timedelta(seconds=i, microseconds=i * 211)
        conn.execute("INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, power_w, energy_j)"
                     " VALUES (%s, %s, %s, %s, 0, %s, 600.5, %s)", (CLUSTER, job, at, node, f"GPU-{node}", joules))


def _read(conn: psycopg.Connection[Any], job: str) -> list[tuple[Any, ...]]:
    rows = conn.execute(f"SELECT node, ts, energy_j FROM {tiers.samples(['energy_j'])} s",
                        {"job": job, "cluster": CLUSTER}).fetchall()
    return sorted(tuple(r.values()) for r in rows)


def _differences(conn: psycopg.Connection[Any], job: str) -> dict[str, bool]:
    """Per node: whether its block keeps the energy as differences."""
    rows = conn.execute("SELECT d.node, b.energy_j_first IS NOT NULL AS d FROM gpu_sample_blocks b "
                        "JOIN gpu_devices d ON d.id = b.device WHERE b.job_id = %s", (job,)).fetchall()
    return {r["node"]: r["d"] for r in rows}


def _counting(n: int, start: float, per_tick: float, reset_at: int | None = None) -> list[float | None]:
    values, value = [], start
    for i in range(n):
        value = 0.0 if i == reset_at else value + per_tick + (i * 7 % 5)
        values.append(value)
    return values


SERIES: dict[str, tuple[list[float | None], bool]] = {
    # the node daemon's whole J, with a counter reset in the middle
    "steady": (_counting(300, 1e6, 600.0, reset_at=150), True),
    # a NULL: the block keeps the values
    "gap": ([None, *_counting(99, 1e6, 600.0)], False),
    # finer than a J (no step): differences of mJ
    "fine": (_counting(50, 1e6 + 0.125, 600.5), True),
    # values spanning more than an int4 of differences (4e12 J), falling to 0: the values
    "edges": ([4e12 - 1, 4e12 - 2, 0.0, 1.0, 4e12 - 3], False),
    # a span of 2^31 - 1 J: differences at the int4 extremes
    "wide": ([1e6, 1e6 + 2**31 - 1, 1e6, 1e6 + 2**31 - 1], True),
    # a span of 2^31: the values
    "over": ([1e6, 1e6 + 2**31, 1e6 + 1], False),
}


def test_counters_come_back_from_differences(url: str) -> None:
    job = f"counters-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        for node, (energy, _) in SERIES.items():
            _insert(conn, job, node, energy)
        before = _read(conn, job)
        _pass(conn)
        assert conn.execute("SELECT count(*) AS n FROM gpu_samples WHERE job_id = %s", (job,)).fetchone()["n"] == 0
        assert _read(conn, job) == before
        assert _differences(conn, job) == {node: kept for node, (_, kept) in SERIES.items()}


def test_blocks_packed_before_counters_read_alike(empty_database_url: str) -> None:
    """Downgrading 0019 writes a counter block's values into the float array every version reads
    first, which is how blocks packed before are made here; they read alike, and a late sample
    repacks their hour as differences."""
    url = empty_database_url
    job = f"oldcounters-{uuid.uuid4().hex[:8]}"
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        for node, (energy, _) in SERIES.items():
            _insert(conn, job, node, energy)
        before = _read(conn, job)
        _pass(conn)
    migrate.downgrade(url, "0018")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        floats = conn.execute("SELECT energy_j_f IS NOT NULL AND energy_j_p0 IS NULL AS f FROM gpu_sample_blocks b "
                              "JOIN gpu_devices d ON d.id = b.device WHERE d.node = 'steady'").fetchall()
        assert floats == [{"f": True}]
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        assert _read(conn, job) == before
        assert not any(_differences(conn, job).values())
        _insert(conn, job, "steady", [2e6])
        late = _read(conn, job)
        _pass(conn)
        assert _read(conn, job) == late
        assert _differences(conn, job)["steady"]
