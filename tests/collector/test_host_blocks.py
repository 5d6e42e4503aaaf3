"""Packed host samples (migration 0016) read back as they were stored: CPU and memory in byte
planes when their values are such integers, as floats when not, and blocks packed before 0016 alike."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.store import migrate, schema
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.packed_params import TIME_PLANES
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction, host_tier
from jobsight.collector.tiers.packed_format import HOST_ENCODINGS, HOST_VALUES
from tests.conftest import own_database

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (the dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CLUSTER = "default"
DAY = dt.date.today() - dt.timedelta(days=30)
T0 = dt.datetime.combine(DAY, dt.time(10), dt.UTC)
INT8 = 2**63


@pytest.fixture(scope="module")
def url(postgres: EmbeddedPostgres) -> Iterator[str]:
    yield from own_database(postgres, "host")


def _pass(conn: psycopg.Connection[Any]) -> None:
    compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)


def _insert(conn: psycopg.Connection[Any], job: str, rows: list[dict[str, Any]], node: str | None,
            at: dt.datetime = T0) -> None:
    PartitionKeeper().ensure(conn, "host_samples", [DAY])
    for i, values in enumerate(rows):
        columns = ["cluster", "job_id", "ts", "node", *values]
        conn.execute(
            f"INSERT INTO host_samples ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})",
            [CLUSTER, job, at + dt.timedelta(seconds=i, microseconds=i * 321), node, *values.values()],
        )


def _raw(conn: psycopg.Connection[Any], job: str) -> list[dict[str, Any]]:
    return conn.execute(f"SELECT ts, node, {', '.join(HOST_VALUES)} FROM host_samples WHERE job_id = %s",
                        (job,)).fetchall()


def _both(conn: psycopg.Connection[Any], job: str) -> list[dict[str, Any]]:
    return conn.execute(f"SELECT * FROM {host_tier.samples()} h", {"job": job, "cluster": CLUSTER}).fetchall()


def _same(kept: Any, was: Any) -> bool:
    if isinstance(was, float) and math.isnan(was):
        return isinstance(kept, float) and math.isnan(kept)
    return bool(kept == was and type(kept) is type(was))


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(repr(row[c]) for c in ("ts", "node", *HOST_VALUES))


def test_every_host_column_has_a_place() -> None:
    """A column added to host_samples must be given an encoding, and the blocks its columns."""
    assert tuple(HOST_ENCODINGS) == HOST_VALUES
    blocks = [c.name for c in schema.host_sample_blocks.columns]
    key = ["cluster", "job_id", "ts", "block", "node", "samples", "first_ts", "last_ts", "sample_ts", *TIME_PLANES]
    assert blocks[:len(key)] == key
    stored = [c for e in HOST_ENCODINGS.values() for c in e.stored]
    legacy = [c for e in HOST_ENCODINGS.values() for c in e.legacy]
    assert sorted(blocks[len(key):]) == sorted([*stored, *legacy])  # each once, written or read
    assert not set(stored) & set(legacy)


def _near(base: int, scale: int) -> Any:
    """Values around one base, as a series' are, at the precision the planes keep."""
    return st.one_of(st.none(), st.integers(-5000, 5000).map(lambda d: (base + d) / scale))


def _scaled(scale: int, bound: int) -> Any:
    whole = st.integers(-bound, bound).flatmap(lambda base: _near(base, scale))
    return st.one_of(whole, st.floats(allow_nan=True, allow_infinity=True))


def _bytes() -> Any:
    anywhere = st.integers(-INT8, INT8 - 1)
    around = anywhere.flatmap(lambda base: st.one_of(st.none(), st.integers(-4096, 4096).map(lambda d: base + d)))
    return st.one_of(anywhere, around.filter(lambda v: v is None or -INT8 <= v < INT8))


SAMPLE = st.fixed_dictionaries({
    "cpu_util": _scaled(100, 10_000_000),
    "cpu_time_s": _scaled(1_000_000, 2**50),
    "mem_used": _bytes(),
    "mem_limit": _bytes(),
    "energy_j": st.one_of(st.none(), st.floats()),
    "power_source": st.sampled_from([None, "rapl", "ipmi"]),
    "energy_split": st.sampled_from([None, "gpu share", "x'; DROP TABLE host_samples; --"]),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(series=st.lists(SAMPLE, min_size=1, max_size=30))
def test_random_host_series_come_back(url: str, series: list[dict[str, Any]]) -> None:
    """Any series of one node, NaN, infinities, NULLs and int8 extremes included, reads back from
    the packed tier exactly as it was stored, with its types."""
    job = f"hprop-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _insert(conn, job, series, "n1")
        before = sorted(_raw(conn, job), key=lambda r: r["ts"])
        _pass(conn)
        assert conn.execute("SELECT count(*) AS n FROM host_samples WHERE job_id = %s", (job,)).fetchone()["n"] == 0
        after = sorted(_both(conn, job), key=lambda r: r["ts"])
    assert len(after) == len(before)
    for kept, was in zip(after, before, strict=True):
        for column in ("ts", "node", *HOST_VALUES):
            assert _same(kept[column], was[column]), (column, was[column], kept[column])


def _steady(n: int) -> list[dict[str, Any]]:
    """What the node daemon sends: CPU percent in hundredths, CPU seconds from microseconds."""
    return [{"cpu_util": round(700 + (i * 37 % 200) + 0.25, 2), "cpu_time_s": (10**9 + i * 7_123_457) / 1e6,
             "mem_used": 3 * 2**38 + (i * 7919 % 4096) * 4096, "mem_limit": 2**40} for i in range(n)]


def test_host_blocks_packed_before_byte_planes_read_alike(empty_database_url: str) -> None:
    """What the node daemon sends packs in planes (no float array); a block packed before migration
    0016 (whole arrays, made here by its downgrade) reads as it did, and a late sample merged into
    its hour repacks it in planes."""
    url = empty_database_url
    job = f"hlegacy-{uuid.uuid4().hex[:8]}"
    migrate.upgrade(url)
    odd = [{"cpu_util": 1 / 3, "cpu_time_s": 0.1 + 0.2, "mem_used": None, "energy_j": 5.5, "power_source": "rapl"},
           {"cpu_util": float("nan"), "cpu_time_s": float("inf"), "mem_used": -1, "mem_limit": None}]
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _insert(conn, job, _steady(300), "n1")
        _insert(conn, job, odd, None)
        before = sorted(map(_key, _raw(conn, job)))
        _pass(conn)
        planes = conn.execute(
            "SELECT node, cpu_util IS NULL AND cpu_time_s IS NULL AND mem_used IS NULL AS planes,"
            " cpu_util_p0 IS NOT NULL AND mem_used_p1 IS NOT NULL AND mem_limit_p0 IS NULL AS planed"
            " FROM host_sample_blocks ORDER BY node").fetchall()
        assert planes == [{"node": "n1", "planes": True, "planed": True},
                          {"node": None, "planes": False, "planed": False}]
        assert sorted(map(_key, _both(conn, job))) == before
    migrate.downgrade(url, "0015")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        kinds = conn.execute(
            "SELECT count(*) FILTER (WHERE cpu_util IS NOT NULL AND mem_used IS NOT NULL) AS legacy,"
            " count(*) FILTER (WHERE cpu_util_base IS NOT NULL OR mem_used_base IS NOT NULL) AS planes"
            " FROM host_sample_blocks").fetchone()
        assert kinds == {"legacy": 2, "planes": 0}
        assert sorted(map(_key, _both(conn, job))) == before
        late = {"cpu_util": 12.5, "cpu_time_s": 1000.000001, "mem_used": 7, "mem_limit": 2**40}
        _insert(conn, job, [late], "n1", at=T0 + dt.timedelta(seconds=0.5))
        with_late = sorted([*before, *map(_key, _raw(conn, job))])
        _pass(conn)
        repacked = conn.execute("SELECT cpu_util IS NULL AND cpu_util_base IS NOT NULL AS planes"
                                " FROM host_sample_blocks WHERE node = 'n1'").fetchall()
        assert repacked == [{"planes": True}]
        assert sorted(map(_key, _both(conn, job))) == with_late
