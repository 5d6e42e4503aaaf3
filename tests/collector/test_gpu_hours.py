"""The per-hour GPU rollup (``gpu_hours``): written by the ingest path beside the minutes, the
sums of the job's minute rows however the samples were split into batches and groups; read by
``queries.gpu_series`` for buckets of two hours or more, with the answers the minutes give;
left alone by the compaction pass; and filled from both tiers of minutes by migration 0007."""

from __future__ import annotations

import datetime as dt
import math
import random
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.ingest import write as ingest
from jobsight.collector.ingest.body import decode_body
from jobsight.collector.query import series as queries
from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.partitions import PartitionKeeper, partition_name
from jobsight.collector.store.timestamps import ts_from_us
from jobsight.collector.tiers import compaction
from jobsight.collector.tiers.rollup import hourly, merged, rebuild_minutes, upsert_hours, upsert_minutes
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post
from tests.conftest import own_database

CLUSTER = "default"  # what helpers.gz's envelopes name
S = 1_000_000
HOUR_US = 3600 * S
KEY = ("node", "gpu_index", "mig_uuid", "ts")
ADDED = ("samples", "util_gpu_sum", "util_gpu_n", "util_idle_n", "util_mem_sum", "util_mem_n", "power_sum",
         "power_n", "temp_sum", "temp_n", "energy_n")
GREATEST = ("util_gpu_max", "mem_used_max", "mem_total_max", "energy_max", "last_ts")
LEAST = ("energy_min", "first_ts")
VALUES = ("gpu_uuid", *ADDED, *GREATEST, *LEAST, "lost")
BODY_LIMIT = 128 * 1024 * 1024


def _sample(job: str, ts: int, node: str, index: int, mig: str | None, tick: int) -> dict[str, Any]:
    """A sample with values that are not whole numbers, readings missing at times, idle spells
    and, rarely, a lost sample."""
    return {
        "kind": "gpu_sample", "job": job, "ts": ts, "node": node, "gpu_index": index,
        "gpu_uuid": f"GPU-{node}-{index}", "mig_uuid": mig, "gpu_name": "NVIDIA H100",
        "util_gpu": None if tick % 17 == 0 else (tick * 37 % 997) / 10 + 0.125,
        "util_mem": None if tick % 5 == 0 else 30.0 + tick % 7 / 3,
        "mem_used": (20 + index) * 2**30 + tick * 4096, "mem_total": 80 * 2**30,
        "power_w": 300.123 + (tick * 13 % 50) / 7, "energy_j": 1e6 + tick * 6001.5,
        "temp_c": None if tick % 11 == 0 else 55.5 + tick % 4, "lost": tick % 97 == 0,
    }


def _run(job: str, t0: int, ticks: int, step_s: int = 20) -> list[dict[str, Any]]:
    """``ticks`` ticks ``step_s`` apart from ``t0`` on two GPUs of n1 and a MIG device of n2."""
    return [_sample(job, t0 + tick * step_s * S + node * 333, f"n{node}", index, mig, tick)
            for tick in range(ticks)
            for node, index, mig in ((1, 0, None), (1, 1, None), (2, 0, "MIG-a"))]


def _hour_ago(hours: int) -> int:
    """The start of the UTC hour ``hours`` ago, in µs."""
    us = now_us() - hours * HOUR_US
    return us - us % HOUR_US


def _chunks(records: list[dict[str, Any]], rng: random.Random, most: int) -> list[list[dict[str, Any]]]:
    out, at = [], 0
    while at < len(records):
        size = rng.randint(1, most)
        out.append(records[at:at + size])
        at += size
    return out


def _post_all(client: Any, batches: list[list[dict[str, Any]]], threads: int = 1) -> None:
    bodies = [gz(batch) for batch in batches]
    with ThreadPoolExecutor(threads) as pool:
        answers = list(pool.map(lambda body: post(client, body), bodies))
    assert [a.status_code for a in answers] == [200] * len(bodies), [a.text for a in answers if a.status_code != 200]


def _store(database_url: str, batches: list[list[dict[str, Any]]], group: bool) -> None:
    """Through ``ingest.store_group`` itself: all batches in one group, or each in a transaction of
    its own (what the writer does with the batches of a group that failed)."""
    prepared = [decode_body(gz(batch), "gzip", BODY_LIMIT) for batch in batches]
    keeper = PartitionKeeper()
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        for _, rows in prepared:
            ingest.ensure_partitions(conn, keeper, rows)
        for items in [prepared] if group else [[item] for item in prepared]:
            with conn.transaction():
                ingest.store_group(conn, items)


def _rows(conn: psycopg.Connection[Any], table: str, job: str) -> list[dict[str, Any]]:
    return conn.execute(
        f"SELECT {', '.join((*KEY, *VALUES))} FROM {table} WHERE job_id = %s AND cluster = %s ORDER BY "
        f"{', '.join(KEY)}", (job, CLUSTER)).fetchall()


def _hours_of(minutes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hour rows that ``minutes`` add up to, worked out here from the rule, not the code."""
    hours: dict[tuple[Any, ...], dict[str, Any]] = {}
    for minute in minutes:
        hour = minute["ts"].astimezone(dt.UTC).replace(minute=0)
        key = (minute["node"], minute["gpu_index"], minute["mig_uuid"], hour)
        row = hours.get(key)
        if row is None:
            hours[key] = {**minute, "ts": hour}
            continue
        for name in ADDED:
            row[name] += minute[name]
        for columns, pick in ((GREATEST, max), (LEAST, min)):
            for column in columns:
                known = [v for v in (row[column], minute[column]) if v is not None]
                row[column] = pick(known) if known else None
        row["lost"] = row["lost"] or minute["lost"]
        row["gpu_uuid"] = min(row["gpu_uuid"], minute["gpu_uuid"])
    return [hours[key] for key in sorted(hours)]


def _same(rows: list[dict[str, Any]], expected: list[dict[str, Any]], rel: float = 1e-9) -> None:
    """Equal rows, floats up to the order they were summed in."""
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        assert list(row) == list(want)
        for name, value in want.items():
            if isinstance(value, float):
                assert isinstance(row[name], float) and math.isclose(row[name], value, rel_tol=rel), (name, row)
            elif isinstance(value, dt.datetime):
                assert row[name] == value, (name, row, want)
            else:
                assert row[name] == value and type(row[name]) is type(value), (name, row, want)


def test_hours_are_the_sums_of_the_minutes_however_the_batches_were_split(
    client: Any, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    """The same 2 h 40 min of samples (crossing three hours) stored five ways: one batch, batches
    of random sizes posted in order and from four threads at once, and straight through
    ``store_group`` as one group and batch by batch (the fallback of a failed group)."""
    t0 = _hour_ago(5) + 25 * 60 * S
    rng = random.Random(3)
    jobs = [f"h{way}-{uuid.uuid4().hex[:8]}" for way in range(5)]
    runs = [_run(job, t0, 450) for job in jobs]
    _post_all(client, [runs[0]])
    _post_all(client, _chunks(runs[1], rng, 200))
    _post_all(client, _chunks(runs[2], rng, 60), threads=4)
    _store(database_url, _chunks(runs[3], rng, 150), group=True)
    _store(database_url, _chunks(runs[4], rng, 150), group=False)

    first = _rows(conn, "gpu_hours", jobs[0])
    assert len(first) == 3 * 3 and sum(r["samples"] for r in first) == 3 * 450
    assert {r["ts"].astimezone(dt.UTC).minute for r in first} == {0}
    for job in jobs:
        hours = _rows(conn, "gpu_hours", job)
        _same(hours, _hours_of(_rows(conn, "gpu_minutes", job)))
        _same(hours, first)


def _aligned(start_us: int, points: int, hours: int) -> tuple[dt.datetime, dt.datetime]:
    """A window from ``start_us`` whose ``points`` buckets are exactly ``hours`` wide:
    ``TimeRange.bucket_seconds`` gives ``span // points + 1`` µs."""
    return ts_from_us(start_us), ts_from_us(start_us + points * (hours * HOUR_US - 1))


def test_wide_buckets_read_the_hours_and_give_what_the_minutes_give(
    client: Any, conn: psycopg.Connection[Any], job_id: str
) -> None:
    t0 = _hour_ago(7) + 10 * 60 * S
    _post_all(client, [_run(job_id, t0, 900)])  # 5 hours
    start_us = t0 - t0 % HOUR_US
    for points, hours in ((3, 2), (1, 6), (2, 3)):
        start, end = _aligned(start_us, points, hours)
        statements = queries.gpu_series_statements(conn, CLUSTER, job_id, start=start, end=end, points=points)
        assert [q for q, _ in statements] == [queries.GPU_FROM_HOURS, queries.GPU_FROM_MINUTES,
                                              queries.GPU_FROM_SAMPLES]
        assert statements[0][1] == statements[1][1] and statements[0][1]["width"] == hours * 3600
        from_hours = queries.gpu_series(conn, CLUSTER, job_id, start=start, end=end, points=points)
        from_minutes = conn.execute(*statements[1]).fetchall()
        assert len(from_hours) == 3 * points
        _same(from_hours, from_minutes)

    # Off the hour, a microsecond over whole hours: every sample still counted once, and the
    # buckets start from the window's first hour.
    whole = queries.gpu_series(conn, CLUSTER, job_id, points=2)
    statements = queries.gpu_series_statements(conn, CLUSTER, job_id, points=2)
    assert statements[0][0] == queries.GPU_FROM_HOURS
    assert statements[0][1]["origin"] == ts_from_us(start_us) and statements[0][1]["width"] > 7200
    assert sum(r["samples"] for r in whole) == 3 * 900
    assert {r["bucket"] for r in whole} == {ts_from_us(start_us),
                                            ts_from_us(start_us) + dt.timedelta(seconds=statements[0][1]["width"])}
    # Narrower buckets read the minutes, as before.
    narrow = queries.gpu_series_statements(conn, CLUSTER, job_id, points=5)
    assert [q for q, _ in narrow] == [queries.GPU_FROM_MINUTES, queries.GPU_FROM_SAMPLES]


def test_utilisation_alone_reads_what_the_whole_series_says_of_it(
    client: Any, conn: psycopg.Connection[Any], job_id: str
) -> None:
    """The heatmap's narrow read (``measures=UTILISATION``) at each grain (the hours, the minutes, the
    samples): the whole series' rows, less the other measures, from statements that compute none of them."""
    t0 = _hour_ago(7) + 10 * 60 * S
    _post_all(client, [_run(job_id, t0, 900)])  # 5 hours
    start_us = t0 - t0 % HOUR_US
    start, end = _aligned(start_us, 2, 2)
    for points, grain in ((2, queries.GPU_FROM_HOURS), (20, queries.GPU_FROM_MINUTES), (400, queries.GPU_FROM_SAMPLES)):
        window = {"start": start, "end": end, "points": points}
        assert queries.gpu_series_statements(conn, CLUSTER, job_id, **window)[0][0] == grain
        narrow_statements = queries.gpu_series_statements(conn, CLUSTER, job_id, **window,
                                                          measures=queries.UTILISATION)
        assert all("power" not in q and "mem_used" not in q for q, _ in narrow_statements)
        whole = queries.gpu_series(conn, CLUSTER, job_id, **window)
        narrow = queries.gpu_series(conn, CLUSTER, job_id, **window, measures=queries.UTILISATION)
        left_out = set(queries.GPU_MEASURES) - {"util_gpu"}
        assert whole and narrow == [{k: v for k, v in row.items() if k not in left_out} for row in whole]
    with pytest.raises(ValueError, match="not a GPU measure: gpu_name"):
        queries.gpu_series(conn, CLUSTER, job_id, measures=("util_gpu", "gpu_name"))


def test_a_row_a_gpu_holds_the_rows_buckets_and_values(
    client: Any, conn: psycopg.Connection[Any], job_id: str
) -> None:
    """``gpu_series_by_gpu`` (a page's read: a row a GPU, its buckets and values as arrays) at each grain:
    the rows ``gpu_series`` gives, GPU by GPU and bucket by bucket, NULL readings and the MIG device too."""
    t0 = _hour_ago(7) + 10 * 60 * S
    _post_all(client, [_run(job_id, t0, 900)])  # 5 hours
    start_us = t0 - t0 % HOUR_US
    start, end = _aligned(start_us, 2, 2)
    # 800 buckets: a sample each (the samples are 20 s apart), so a NULL reading is a NULL bucket.
    for points, grain in ((2, queries.GPU_FROM_HOURS), (20, queries.GPU_FROM_MINUTES), (800, queries.GPU_FROM_SAMPLES)):
        assert queries.gpu_series_statements(conn, CLUSTER, job_id, start=start, end=end, points=points)[0][0] == grain
        for measures in (queries.GPU_MEASURES, queries.UTILISATION):
            window = {"start": start, "end": end, "points": points, "measures": measures}
            rows = queries.gpu_series(conn, CLUSTER, job_id, **window)
            gpus = queries.gpu_series_by_gpu(conn, CLUSTER, job_id, **window)
            assert [(g["node"], g["gpu_index"], g["mig_uuid"]) for g in gpus] == [
                ("n1", 0, None), ("n1", 1, None), ("n2", 0, "MIG-a")]
            exploded = [{"node": g["node"], "gpu_index": g["gpu_index"], "mig_uuid": g["mig_uuid"],
                         "bucket": ts_from_us(at), "bucket_s": g["bucket_s"], "interval_s": g["interval_s"],
                         **{m: g[m][i] for m in measures}}
                        for g in gpus for i, at in enumerate(g["bucket_us"])]
            _same(exploded, [{k: row[k] for k in exploded[0]} for row in rows])
            for g in gpus:
                own = [r for r in rows if (r["node"], r["gpu_index"]) == (g["node"], g["gpu_index"])]
                assert g["bucket"] == own[0]["bucket"] and g["samples"] == sum(r["samples"] for r in own)
    assert any(v is None for g in gpus for v in g["util_gpu"])  # the last read's, the samples'


def test_a_chart_read_sets_its_planner_settings_for_its_transaction_only(
    client: Any, conn: psycopg.Connection[Any], job_id: str
) -> None:
    _post_all(client, [_run(job_id, _hour_ago(2), 30)])
    before = {name: conn.execute(f"SHOW {name}").fetchone()[name] for name in queries.CHART_SETTINGS}
    assert before != queries.CHART_SETTINGS
    for read in (queries.gpu_series, queries.gpu_series_by_gpu):
        with conn.transaction():
            assert read(conn, CLUSTER, job_id, points=10)
            assert {name: conn.execute(f"SHOW {name}").fetchone()[name]
                    for name in queries.CHART_SETTINGS} == queries.CHART_SETTINGS
        assert {name: conn.execute(f"SHOW {name}").fetchone()[name] for name in queries.CHART_SETTINGS} == before


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


@pytest.fixture(scope="module")
def hours_url(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A database of its own: a compaction pass packs every job's closed days."""
    yield from own_database(postgres, "hours")


def _long_job(conn: psycopg.Connection[Any], job: str, start: dt.datetime, days: int, gpus: int,
              step_s: int) -> int:
    """``gpus`` GPUs sampled every ``step_s`` seconds for ``days`` days, written around the ingest
    path with their rollups (``rebuild_minutes``), as seeds and benches do. Returns the samples."""
    keeper = PartitionKeeper()
    day_list = [start.date() + dt.timedelta(days=n) for n in range(days + 1)]
    keeper.ensure(conn, "gpu_samples", day_list)
    keeper.ensure(conn, "gpu_minutes", day_list)
    conn.execute(
        """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, util_gpu, util_mem, mem_used,
                                    mem_total, power_w, energy_j, temp_c, lost)
           SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'node' || (g / 8), (g %% 8)::int2, 'GPU-' || g,
                  (t / 60 %% 100)::float8 + 0.5, 40, 2^34::bigint + t, 2^36::bigint, 300.25 + t %% 50,
                  1e6 + t * 300.5, 60, t %% 7777 = 0
           FROM generate_series(0, %(last)s, %(step)s) t, generate_series(0, %(gpus)s - 1) g""",
        {"c": CLUSTER, "j": job, "s": start, "last": days * 86400 - 1, "step": step_s, "gpus": gpus},
    )
    rebuild_minutes(conn, CLUSTER, job)
    conn.execute("ANALYZE gpu_samples")
    conn.execute("ANALYZE gpu_minutes")
    conn.execute("ANALYZE gpu_hours")
    return gpus * len(range(0, days * 86400, step_s))


def _relations(plan: Any) -> set[str]:
    """Every relation an EXPLAIN (FORMAT JSON) plan scans."""
    if isinstance(plan, dict):
        found = {plan["Relation Name"]} if "Relation Name" in plan else set()
        return found.union(*(_relations(value) for value in plan.values()))
    if isinstance(plan, list):
        return set().union(*(_relations(value) for value in plan))
    return set()


def test_a_long_job_page_reads_only_hours(hours_url: str) -> None:
    """9 days of 16 GPUs at 100 buckets (2.2 h): the first statement reads the job's hour rows only."""
    job = f"long-{uuid.uuid4().hex[:8]}"
    start = dt.datetime.combine(dt.date.today() - dt.timedelta(days=40), dt.time(6, 30), dt.UTC)
    with psycopg.connect(hours_url, autocommit=True, row_factory=dict_row) as conn:
        samples = _long_job(conn, job, start, days=9, gpus=16, step_s=300)
        statements = queries.gpu_series_statements(conn, CLUSTER, job, points=100)
        assert statements[0][0] == queries.GPU_FROM_HOURS
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statements[0][0], statements[0][1]).fetchone()
        assert plan is not None
        scanned = _relations(plan["QUERY PLAN"])
        assert scanned and all(name.startswith("gpu_hours_p") for name in scanned), scanned
        hours = 9 * 24 + 1  # from 06:30 on day 0 to 06:25 on day 9
        assert conn.execute("SELECT count(*) AS n FROM gpu_hours WHERE job_id = %s", (job,)).fetchone() == {
            "n": hours * 16}
        rows = queries.gpu_series(conn, CLUSTER, job, points=100)
        assert sum(r["samples"] for r in rows) == samples
        assert len({r["bucket"] for r in rows}) <= 100 and len(rows) == 16 * len({r["bucket"] for r in rows})


def test_compaction_leaves_the_hours_as_they_are(hours_url: str) -> None:
    """A pass packs the job's minutes and samples and empties their raw partitions; the hour rows,
    and the wide buckets read from them, stay the same. Hour partitions go with the packed tier's
    retention, not the raw tables'."""
    job = f"c-{uuid.uuid4().hex[:8]}"
    start = dt.datetime.combine(dt.date.today() - dt.timedelta(days=20), dt.time(20), dt.UTC)
    expired = dt.date.today() - dt.timedelta(days=200)
    keeper = PartitionKeeper()
    with psycopg.connect(hours_url, autocommit=True, row_factory=dict_row) as conn:
        _long_job(conn, job, start, days=1, gpus=4, step_s=30)
        hours = _rows(conn, "gpu_hours", job)
        series = queries.gpu_series(conn, CLUSTER, job, points=10)
        keeper.ensure(conn, "gpu_hours", [expired])

        report = compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)
        assert {start.date(), start.date() + dt.timedelta(days=1)} <= {d.day for d in report.days}
        assert conn.execute("SELECT count(*) AS n FROM gpu_minutes WHERE job_id = %s", (job,)).fetchone() == {"n": 0}
        assert conn.execute("SELECT count(*) > 0 AS packed FROM gpu_minute_blocks WHERE job_id = %s",
                            (job,)).fetchone() == {"packed": True}
        assert _rows(conn, "gpu_hours", job) == hours
        assert queries.gpu_series(conn, CLUSTER, job, points=10) == series

        keeper.load(conn)
        assert partition_name("gpu_hours", expired) not in keeper.drop_older_than(conn, 180)  # the raw rule
        report = compaction.run_pass(conn, keeper, older_than=dt.timedelta(0), packed_retention_days=180)
        assert partition_name("gpu_hours", expired) in report.dropped
        assert partition_name("gpu_hours", start.date()) not in report.dropped
        assert _rows(conn, "gpu_hours", job) == hours


def _minute_partitions(conn: psycopg.Connection[Any], days: list[dt.date]) -> None:
    """gpu_minutes partitions made by hand: at revision 0006 the keeper's companion (gpu_hours)
    does not exist yet."""
    for day in days:
        conn.execute(f"""CREATE TABLE IF NOT EXISTS {partition_name("gpu_minutes", day)} PARTITION OF gpu_minutes
                         FOR VALUES FROM ('{day} 00:00:00+00') TO ('{day + dt.timedelta(days=1)} 00:00:00+00')""")


def _minutes(job: str, records: list[dict[str, Any]]) -> Any:
    """The minute rows the ingest path makes of ``records`` (as one batch) under ``job``."""
    _, prepared = decode_body(gz([{**r, "job": job} for r in records]), "gzip", BODY_LIMIT)
    return merged([(CLUSTER, prepared.minutes)])


def test_the_upgrade_fills_the_hours_from_both_tiers_of_minutes(empty_database_url: str) -> None:
    """Minutes written at revision 0006 (a day of them packed, then late minutes for that day on
    top of packed ones), then 0007: its hours are what ingest writes for the same minutes.
    Downgrade drops the table; upgrading again fills it again."""
    job, reference = f"m-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
    day = dt.date.today() - dt.timedelta(days=3)
    days = [day, day + dt.timedelta(days=1)]
    t0 = int((dt.datetime.combine(days[1], dt.time(), dt.UTC) - ts_from_us(0)) / dt.timedelta(microseconds=1))
    records = _run(job, t0 - 110 * 60 * S, 660)  # 22:10 to 01:50, every 20 s
    late = [{**r, "ts": r["ts"] + 10 * S} for r in records
            if r["node"] == "n1" and t0 - 40 * 60 * S <= r["ts"] < t0 - 30 * 60 * S]
    migrate.upgrade(empty_database_url, "0006")
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        _minute_partitions(conn, days)
        with conn.transaction():
            upsert_minutes(conn, _minutes(job, records))
        compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(days=2), packed_retention_days=0)
        assert conn.execute("SELECT count(*) > 0 AS packed FROM gpu_minute_blocks").fetchone() == {"packed": True}
        assert conn.execute(f"SELECT count(*) AS n FROM {partition_name('gpu_minutes', day)}").fetchone() == {"n": 0}
        with conn.transaction():
            upsert_minutes(conn, _minutes(job, late))  # minutes that have a packed row too

    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        for d in days:
            assert conn.execute("SELECT to_regclass(%s) IS NOT NULL AS made", (partition_name("gpu_hours", d),)
                                ).fetchone() == {"made": True}
        for part in (records, late):  # the reference job, through the ingest path's writers
            with conn.transaction():
                minutes = _minutes(reference, part)
                upsert_minutes(conn, minutes)
                upsert_hours(conn, hourly(minutes))
        backfilled = _rows(conn, "gpu_hours", job)
        assert len(backfilled) == 4 * 3 and sum(r["samples"] for r in backfilled) == len(records) + len(late)
        _same(backfilled, _rows(conn, "gpu_hours", reference))

    migrate.downgrade(empty_database_url, "0006")
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert conn.execute("SELECT to_regclass('gpu_hours') AS t").fetchone() == {"t": None}
        assert conn.execute("SELECT to_regclass(%s) AS t", (partition_name("gpu_hours", day),)).fetchone() == {
            "t": None}
    migrate.upgrade(empty_database_url)
    assert migrate.autogenerate_diff(empty_database_url) == []
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        _same(_rows(conn, "gpu_hours", job), backfilled)
