"""The packed format keeps every column (exactly, but for the GPM ratios), and the job page's plans
read the rollup or the packed tier, never raw samples, for a long job."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.query import series as queries
from jobsight.collector.store import migrate, packed_params, schema
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.packed_params import DEVICE_COLUMNS
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction
from jobsight.collector.tiers import reads as tiers
from jobsight.collector.tiers.packed_format import ENCODINGS
from jobsight.collector.tiers.rollup import rebuild_minutes
from tests.conftest import own_database

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (the dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CLUSTER = "default"
DAY = dt.date.today() - dt.timedelta(days=30)
T0 = dt.datetime.combine(DAY, dt.time(10), dt.UTC)
MEASURES = tuple(ENCODINGS)
GPM = ("sm_active", "tensor_active")


@pytest.fixture(scope="module")
def url(postgres: EmbeddedPostgres) -> Iterator[str]:
    yield from own_database(postgres, "packed")


def _pass(conn: psycopg.Connection[Any]) -> compaction.PassReport:
    return compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)


def test_every_column_has_a_place() -> None:
    """A column added to gpu_samples or gpu_minutes must be given an encoding here too."""
    raw = [c.name for c in schema.gpu_samples.columns]
    assert raw == ["cluster", "job_id", "ts", "node", "gpu_index", "gpu_uuid", "gpu_name", "mig_uuid", *MEASURES]
    assert set(DEVICE_COLUMNS) == {c.name for c in schema.gpu_devices.columns} - {"id"}
    stored = [c for e in ENCODINGS.values() for c in e.stored]
    legacy = [c for e in ENCODINGS.values() for c in e.legacy]
    blocks = [c.name for c in schema.gpu_sample_blocks.columns]
    key = ["cluster", "job_id", "ts", "device", "timeline", "samples", "first_ts", "last_ts"]
    assert blocks[:len(key)] == key
    assert sorted(blocks[len(key):]) == sorted([*stored, *legacy])  # each once, written or read
    assert not set(stored) & set(legacy)
    assert set(compaction.MINUTE_MERGE) == set(tiers.MINUTE_VALUES)
    assert [c.name for c in schema.gpu_minute_blocks.columns] == [*schema.MINUTE_KEY, "minute_ts", *tiers.MINUTE_VALUES]


EDGES = [
    # whole values in every encoding's range, and their extremes
    {"util_gpu": 0.0, "util_mem": 100.0, "mem_used": 0, "mem_total": 2**63 - 1, "power_w": 0.001, "energy_j": 0.0,
     "temp_c": -273.0, "sm_clock_mhz": -(2**31), "mem_clock_mhz": 2**31 - 1, "pcie_tx_kbs": 0, "pcie_rx_kbs": 7,
     "throttle_reasons": -(2**63), "ecc_errors": 2**40, "process_count": 0, "sm_active": 99.99,
     "tensor_active": 0.01, "lost": False, "nvlink_crc_errors": 2**63 - 1, "nvlink_replay_errors": 0,
     "nvlink_recovery_errors": 3, "pcie_replays": 2**32 - 1, "remapped_rows_pending": True, "remap_failure": False,
     "retired_pages_pending": False},
    {"util_gpu": 100.0, "util_mem": None, "mem_used": None, "power_w": 99999.999, "energy_j": 4294967.295,
     "temp_c": 1000.0, "lost": True, "nvlink_crc_errors": 5, "remapped_rows_pending": None, "remap_failure": True},
    {"util_gpu": 37.0, "power_w": 512.5, "energy_j": 1.5, "temp_c": 20.0, "sm_active": 0.0},
]
ODD = [
    # values no integer encoding keeps: the block falls back to float8 for that column
    {"util_gpu": 12.345678901, "util_mem": 1 / 3, "power_w": 300.0001234, "energy_j": 123.4567, "temp_c": 36.6,
     "sm_active": 327.68, "tensor_active": -400.0},
    {"util_gpu": 5.0, "power_w": 1e-300, "energy_j": 5e12, "temp_c": 2.5e-5},
    {"energy_j": 0.001},  # a counter reset inside the hour: 5e12 J to 0 spans more than int4 mJ
]


def _partitions(conn: psycopg.Connection[Any], days: list[dt.date]) -> None:
    """The raw tier's partitions of ``days`` (a pass drops a packed day's)."""
    keeper = PartitionKeeper()
    keeper.ensure(conn, "gpu_samples", days)
    keeper.ensure(conn, "gpu_minutes", days)


def _insert(conn: psycopg.Connection[Any], job: str, rows: list[dict[str, Any]], node: str | None,
            mig: str | None = None, name: str | None = "NVIDIA A100", at: dt.datetime = T0) -> None:
    for i, values in enumerate(rows):
        columns = ["cluster", "job_id", "ts", "node", "gpu_index", "gpu_uuid", "gpu_name", "mig_uuid", *values]
        conn.execute(
            f"INSERT INTO gpu_samples ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})",
            [CLUSTER, job, at + dt.timedelta(seconds=i, microseconds=i * 123), node, 3, "GPU-x", name, mig,
             *values.values()],
        )


def _raw(conn: psycopg.Connection[Any], job: str) -> list[dict[str, Any]]:
    return conn.execute(
        f"SELECT {', '.join(tiers.SAMPLE_KEY + MEASURES)} FROM gpu_samples WHERE job_id = %(job)s",
        {"job": job},
    ).fetchall()


def _both(conn: psycopg.Connection[Any], job: str) -> list[dict[str, Any]]:
    return conn.execute(f"SELECT * FROM {tiers.samples(MEASURES)} s", {"job": job, "cluster": CLUSTER}).fetchall()


def _key(row: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in row.items() if k not in GPM}, default=str, sort_keys=True)


def test_every_value_comes_back(url: str) -> None:
    """Every column of every sample, NULLs and extremes included, comes back bit for bit from the
    packed tier (the GPM ratios: to the nearest hundredth of a point)."""
    job = f"edges-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _partitions(conn, [DAY])
        _insert(conn, job, EDGES, "n1")
        _insert(conn, job, ODD, "n1", mig="MIG-1")  # another device: its own block and fallbacks
        _insert(conn, job, EDGES[:1], None, name=None)  # no node, no name, and one time twice
        _insert(conn, job, [{**EDGES[0], "util_gpu": 99.0}], None, name=None)
        _insert(conn, job, [{"util_gpu": 1.0}], "n2", at=T0 + dt.timedelta(hours=1, minutes=59))
        before = _raw(conn, job)
        assert sorted(map(_key, _both(conn, job))) == sorted(map(_key, before))
        _pass(conn)
        assert conn.execute("SELECT count(*) AS n FROM gpu_samples WHERE job_id = %s", (job,)).fetchone()["n"] == 0
        blocks = conn.execute(
            "SELECT power_w_base IS NULL AS float_power, energy_j_f IS NOT NULL AS float_energy, samples"
            " FROM gpu_sample_blocks WHERE job_id = %s ORDER BY device, ts", (job,)
        ).fetchall()
        kept_as = {(b["float_power"], b["float_energy"]) for b in blocks}
        assert {(False, False), (True, True)} <= kept_as  # mW and mJ where exact, float8 where not
        after = _both(conn, job)
    assert sorted(map(_key, after)) == sorted(map(_key, before))
    by_key = {_key(r): r for r in before}
    for row in after:
        for column in GPM:
            kept, was = row[column], by_key[_key(row)][column]
            assert (kept is None) == (was is None)
            if was is not None and abs(was) <= 327:
                assert abs(kept - was) <= 0.005 + 1e-9, (column, was, kept)
            elif was is not None:
                assert kept == was  # out of the int2 range: the block keeps float8


GPUS, NODES, STEP_S = 64, 8, 30
"""A 64-GPU, 24-hour job; one sample every 30 s is enough to plan the job page's queries."""


def _long_job(conn: psycopg.Connection[Any], job: str, start: dt.datetime) -> None:
    _partitions(conn, [start.date(), start.date() + dt.timedelta(days=1)])
    conn.execute(
        """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, util_gpu, mem_used, power_w,
                                    energy_j, temp_c)
           SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'node' || (g / 8), (g %% 8)::int2, 'GPU-' || g,
                  (t / 30 %% 100)::float8, 2^34::bigint, 300 + t %% 50, 1e6 + t * 300.0, 60
           FROM generate_series(0, 86400 - 1, %(step)s) t, generate_series(0, %(gpus)s - 1) g""",
        {"c": CLUSTER, "j": job, "s": start, "step": STEP_S, "gpus": GPUS},
    )
    rebuild_minutes(conn, CLUSTER, job)
    conn.execute("ANALYZE gpu_samples")
    conn.execute("ANALYZE gpu_minutes")


def _relations(plan: Any) -> list[tuple[str, float]]:
    """(relation, rows it returned) for every scan in an EXPLAIN (ANALYZE, FORMAT JSON) plan."""
    found: list[tuple[str, float]] = []
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            found.append((plan["Relation Name"], plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1)))
        for value in plan.values():
            found += _relations(value)
    elif isinstance(plan, list):
        for value in plan:
            found += _relations(value)
    return found


def _plans(conn: psycopg.Connection[Any], job: str, **window: Any) -> list[list[tuple[str, float]]]:
    """The scans of each statement gpu_series runs (it stops at the first that returns rows)."""
    plans = []
    for query, params in queries.gpu_series_statements(conn, CLUSTER, job, **window):
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()
        assert plan is not None
        plans.append(_relations(plan["QUERY PLAN"]))
        if conn.execute(query, params).fetchone() is not None:
            break
    return plans


def test_the_job_page_of_a_long_job_reads_no_raw_samples(url: str) -> None:
    """64 GPUs for 24 hours: the page's GPU series (600 points, 144 s buckets) comes from the
    rollup while the job is hot and from the packed minutes once packed; a raw-detail zoom of a
    packed job reads packed blocks only."""
    job = f"long-{uuid.uuid4().hex[:8]}"
    start = dt.datetime.combine(DAY - dt.timedelta(days=3), dt.time(6), dt.UTC)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _long_job(conn, job, start)
        hot = _plans(conn, job, points=600)
        assert len(hot) == 1 and any(r.startswith("gpu_minutes_p") for r, _ in hot[0])
        assert not any(r.startswith("gpu_samples") for r, _ in hot[0])

        _pass(conn)  # a month old: packed, and its raw partitions dropped
        packed = _plans(conn, job, points=600)
        assert len(packed) == 1 and any(r.startswith("gpu_minute_blocks_p") for r, _ in packed[0])
        assert not any(r.startswith(("gpu_samples", "gpu_minutes_p")) for r, _ in packed[0])
        zoom = _plans(conn, job, start=start + dt.timedelta(hours=5), end=start + dt.timedelta(hours=5, minutes=10),
                      points=600)  # 1 s buckets: the samples themselves
        assert len(zoom) == 1 and any(r.startswith("gpu_sample_blocks_p") for r, _ in zoom[0])
        assert not any(r.startswith(("gpu_samples", "gpu_minutes")) for r, _ in zoom[0])
        rows = queries.gpu_series(conn, CLUSTER, job, start=start + dt.timedelta(hours=5),
                                  end=start + dt.timedelta(hours=5, minutes=10), points=600)
        assert sum(r["samples"] for r in rows) == GPUS * (600 // STEP_S + 1)


def test_a_late_sample_of_a_packed_day_is_read_with_it(url: str) -> None:
    """Until the next pass, a late sample sits in the (emptied) raw partition: the plan reads it
    there, beside the packed tier, and reads nothing else from the raw tier."""
    job = f"late-{uuid.uuid4().hex[:8]}"
    day = dt.date.today() - dt.timedelta(days=3)
    start = dt.datetime.combine(day - dt.timedelta(days=1), dt.time(6), dt.UTC)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _long_job(conn, job, start)
        _pass(conn)
        late = start + dt.timedelta(hours=20, seconds=7)
        _insert(conn, job, [{"util_gpu": 50.0}], "node0", at=late)
        window = {"start": late - dt.timedelta(minutes=5), "end": late + dt.timedelta(minutes=5), "points": 600}
        scans = _plans(conn, job, **window)[-1]
        raw_rows = sum(rows for relation, rows in scans if relation.startswith("gpu_samples"))
        assert raw_rows == 1
        rows = queries.gpu_series(conn, CLUSTER, job, **window)
        assert sum(r["samples"] for r in rows) == GPUS * (600 // STEP_S) + 1


INT4 = ("sm_clock_mhz", "mem_clock_mhz", "pcie_tx_kbs", "pcie_rx_kbs", "process_count")
INT8 = ("mem_used", "mem_total", "throttle_reasons", "ecc_errors", "nvlink_crc_errors", "nvlink_replay_errors",
        "nvlink_recovery_errors", "pcie_replays")
FLOATS = {"util_gpu": 1, "util_mem": 1, "power_w": 1000, "energy_j": 1000, "temp_c": 1}
BOOLS = ("lost", "remapped_rows_pending", "remap_failure", "retired_pages_pending")


def _near(base: Any, spread: Any, scale: int = 1) -> Any:
    """Values around one base, as a series' are (the planes' common case), or anywhere."""
    return st.one_of(st.none(), spread.map(lambda d: (base + d) / scale if scale != 1 else base + d))


def _stepped(name: str, scale: int = 1) -> Any:
    """Multiples of the column's step (what the node daemon sends; kept as quotients), around a base."""
    step = packed_params.STEPS[name]
    return st.integers(-(2**31) // step, 2**31 // step).flatmap(
        lambda base: _near(base * step, st.integers(-300, 300).map(lambda d: d * step), scale).filter(
            lambda v: v is None or -(2**31) <= v * scale < 2**31))


def _column(name: str) -> Any:
    if name in INT4 or name in INT8:
        bits = 31 if name in INT4 else 63
        anywhere = st.integers(-(2**bits), 2**bits - 1)
        near = anywhere.flatmap(lambda base: _near(base, st.integers(-300, 300)).filter(
            lambda v: v is None or -(2**bits) <= v < 2**bits)) | anywhere
        return near | _stepped(name) if name in packed_params.STEPS else near
    if name in BOOLS:
        return st.one_of(st.none(), st.booleans())
    if name in GPM:
        tenths = st.integers(-3270, 3270).map(lambda k: k / 10)  # the daemon's (kept as quotients)
        return st.one_of(st.none(), st.floats(-400, 400, allow_nan=False), st.just(float("nan")), tenths)
    scale = FLOATS[name]
    # Whole units of the source's precision (kept in planes), and any float (kept as float8).
    whole = st.integers(-(2**31) // scale, 2**31 // scale).flatmap(
        lambda base: _near(base * scale, st.integers(-5000, 5000), scale))
    whole = whole | _stepped(name, scale) if name in packed_params.STEPS else whole
    return st.one_of(whole, st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: v != 0 or
                                                                                    str(v) == "0.0"))


def _same(kept: Any, was: Any, column: str) -> bool:
    if was is None or kept is None:
        return kept is None and was is None
    if isinstance(was, float) and math.isnan(was):
        return isinstance(kept, float) and math.isnan(kept)
    if column in GPM and abs(was) <= 327:
        return bool(abs(kept - was) <= 0.005 + 1e-9)
    return bool(kept == was)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(series=st.lists(st.fixed_dictionaries({name: _column(name) for name in MEASURES}), min_size=1, max_size=30))
def test_random_series_come_back(url: str, series: list[dict[str, Any]]) -> None:
    """Any series of one GPU, NaN, infinities, NULLs and extremes included, reads back from the
    packed tier as it was stored (the GPM ratios to the nearest hundredth)."""
    job = f"prop-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _partitions(conn, [DAY])
        _insert(conn, job, series, "n1")
        before = sorted(_raw(conn, job), key=lambda r: r["ts"])
        _pass(conn)
        assert conn.execute("SELECT count(*) AS n FROM gpu_samples WHERE job_id = %s", (job,)).fetchone()["n"] == 0
        after = sorted(_both(conn, job), key=lambda r: r["ts"])
    assert len(after) == len(before)
    for kept, was in zip(after, before, strict=True):
        for column in (*tiers.SAMPLE_KEY, *MEASURES):
            assert _same(kept[column], was[column], column), (column, was[column], kept[column])


def test_blocks_packed_before_byte_planes_read_alike(empty_database_url: str) -> None:
    """A block packed before migration 0015 (whole-value arrays) reads as it did; a late sample
    merged into its hour repacks it in byte planes. Downgrading 0015 writes blocks packed in
    planes back into those arrays, which is how the old blocks are made here."""
    url = empty_database_url
    job = f"legacy-{uuid.uuid4().hex[:8]}"
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _partitions(conn, [DAY])
        _insert(conn, job, EDGES, "n1")
        _insert(conn, job, ODD, "n1", mig="MIG-1")
        _insert(conn, job, [{"util_gpu": 90.0 + i % 7, "power_w": 600 + i * 0.125, "energy_j": 1e6 + i * 600.5,
                             "mem_used": 2**36 + i * 4096, "pcie_rx_kbs": i * 7919 % 400000} for i in range(200)],
                "n2")
        before = sorted(map(_key, _raw(conn, job)))
        _pass(conn)
    migrate.downgrade(url, "0014")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        kinds = conn.execute(
            "SELECT count(*) FILTER (WHERE util_gpu IS NOT NULL AND power_mw IS NOT NULL) AS legacy,"
            " count(*) FILTER (WHERE util_gpu_base IS NOT NULL) AS planes FROM gpu_sample_blocks").fetchone()
        assert kinds["legacy"] >= 2 and kinds["planes"] == 0
        assert sorted(map(_key, _both(conn, job))) == before
        late = {"util_gpu": 42.0, "power_w": 123.456, "energy_j": 2e6, "mem_used": 7}
        PartitionKeeper().ensure(conn, "gpu_samples", [DAY])  # the pass dropped the packed day's
        _insert(conn, job, [late], "n2", at=T0 + dt.timedelta(seconds=0.5))
        with_late = sorted([*before, *map(_key, _raw(conn, job))])
        _pass(conn)
        repacked = conn.execute(
            "SELECT util_gpu IS NULL AND power_mw IS NULL AND util_gpu_base IS NOT NULL AS planes"
            " FROM gpu_sample_blocks b JOIN gpu_devices d ON d.id = b.device WHERE d.node = 'n2'").fetchall()
        assert repacked == [{"planes": True}]
        assert sorted(map(_key, _both(conn, job))) == with_late


def _daemon_series(ticks: int) -> list[dict[str, Any]]:
    """A GPU's samples at the precision the node daemon sends them (agent/node/gpu/precision.py)."""
    return [{"util_gpu": 90.0 + i % 7, "power_w": 600 + (i * 37 % 101) / 10, "energy_j": 1e6 + i * 600.0 + i % 3,
             "pcie_tx_kbs": i * 7919 % 400 * 1000, "pcie_rx_kbs": None if i % 9 == 0 else 25_000_000 - i * 1000,
             "sm_active": 70 + i % 19 / 10, "tensor_active": 40.5, "mem_used": 2**36 + i * 4096}
            for i in range(ticks)]


def _steps(conn: psycopg.Connection[Any], job: str) -> dict[str | None, dict[str, Any]]:
    """Each node's block: its steps and the bytes of its power planes."""
    power = " + ".join(f"coalesce(pg_column_size(b.power_w_p{k}), 0)" for k in range(packed_params.PLANES["power_w"]))
    rows = conn.execute(
        f"SELECT d.node, {', '.join(f'b.{c}_step' for c in packed_params.STEPS)}, {power} AS power_bytes"
        " FROM gpu_sample_blocks b JOIN gpu_devices d ON d.id = b.device WHERE b.job_id = %s", (job,)).fetchall()
    return {row.pop("node"): row for row in rows}


def test_values_at_the_daemons_precision_keep_quotients(url: str) -> None:
    """A block whose every value of a column is a multiple of its step keeps the quotients (fewer
    bytes) and reads back the same; one value off the step and the block keeps the values."""
    job = f"steps-{uuid.uuid4().hex[:8]}"
    series = _daemon_series(600)
    off = [dict(row) for row in series]
    off[300].update(power_w=600.123, energy_j=1e6 + 0.5, pcie_tx_kbs=1, sm_active=70.25)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _partitions(conn, [DAY])
        _insert(conn, job, series, "daemon")
        _insert(conn, job, off, "off")
        before = sorted(_raw(conn, job), key=lambda r: (r["node"], r["ts"]))
        _pass(conn)
        after = sorted(_both(conn, job), key=lambda r: (r["node"], r["ts"]))
        blocks = _steps(conn, job)
    assert len(after) == len(before)
    for kept, was in zip(after, before, strict=True):
        for column in (*tiers.SAMPLE_KEY, *MEASURES):
            assert _same(kept[column], was[column], column), (column, was[column], kept[column])
    assert {c: blocks["daemon"][f"{c}_step"] for c in packed_params.STEPS} == packed_params.STEPS
    assert {c: blocks["off"][f"{c}_step"] for c in packed_params.STEPS} == {
        c: None if c in ("power_w", "energy_j", "pcie_tx_kbs", "sm_active") else step
        for c, step in packed_params.STEPS.items()}
    assert blocks["daemon"]["power_bytes"] < blocks["off"]["power_bytes"]


def test_blocks_packed_before_steps_read_alike(empty_database_url: str) -> None:
    """Downgrading 0017 writes a stepped block's values whole into the arrays of 0004, which every
    later version reads; they read alike, and a late sample repacks their hour with steps."""
    url = empty_database_url
    job = f"unstepped-{uuid.uuid4().hex[:8]}"
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        _partitions(conn, [DAY])
        _insert(conn, job, _daemon_series(200), "n1")
        before = sorted(map(_key, _raw(conn, job)))
        _pass(conn)
        assert _steps(conn, job)["n1"]["power_w_step"] == packed_params.STEPS["power_w"]
    migrate.downgrade(url, "0016")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        kinds = conn.execute(
            "SELECT power_mw IS NOT NULL AND power_w_base IS NULL AND energy_j_f IS NOT NULL"
            " AND pcie_tx_kbs IS NOT NULL AND sm_active IS NOT NULL AS whole FROM gpu_sample_blocks").fetchall()
        assert kinds == [{"whole": True}]
        assert sorted(map(_key, _both(conn, job))) == before
        PartitionKeeper().ensure(conn, "gpu_samples", [DAY])
        _insert(conn, job, _daemon_series(1), "n1", at=T0 + dt.timedelta(seconds=0.5))
        with_late = sorted([*before, *map(_key, _raw(conn, job))])
        _pass(conn)
        assert _steps(conn, job)["n1"]["power_w_step"] == packed_params.STEPS["power_w"]
        assert sorted(map(_key, _both(conn, job))) == with_late
