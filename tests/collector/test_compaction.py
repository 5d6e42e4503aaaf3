"""The compaction pass: the same data gives the same answers before and after, late samples for a
packed day land and are merged, and the tiers' partitions come and go by their rules.

Answers are compared exactly, except averages and sums of non-integer floats (listed in
:data:`SUMS_OF_FLOATS`): the packed tier returns the same values, but a sum visits them in
another order (hot rows in heap order, packed ones by block), and float addition is not
associative, so the last bits may differ. Counts, extremes, buckets, times and flags are exact.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from jobsight.cli import main as cli_main
from jobsight.collector.jobs import summaries
from jobsight.collector.query import audit as audit_queries
from jobsight.collector.query import series as queries
from jobsight.collector.query.jobs import list_jobs
from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.partitions import PartitionKeeper, partition_name
from jobsight.collector.tiers import compaction, host_tier
from jobsight.rules.report_text import format_report
from tests.collector.helpers import gz, post
from tests.conftest import create_database

CLUSTER = "default"
S = 1_000_000
STEP_S = 10
SUMS_OF_FLOATS = {"util_gpu", "util_mem", "power_w", "temp_c", "mean_util", "energy_kwh", "gpu_hours"}
NOW = dt.datetime.now(dt.UTC)
MIDNIGHT = dt.datetime.combine(NOW.date() - dt.timedelta(days=2), dt.time(), dt.UTC)
"""Between the two packed days: the test job runs 23:00 to 01:00 around it, 2-3 days ago."""
START = MIDNIGHT - dt.timedelta(hours=1)
TICKS = 2 * 3600 // STEP_S


def _us(t: dt.datetime) -> int:
    return int((t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) / dt.timedelta(microseconds=1))


def _sample(job: str, tick: int, node: str, index: int, start: dt.datetime = START, **values: Any) -> dict[str, Any]:
    jitter_us = (tick * 7919) % 1500  # a node daemon's tick: the same for every GPU of the node
    return {"kind": "gpu_sample", "job": job, "ts": _us(start) + tick * STEP_S * S + jitter_us, "node": node,
            "gpu_index": index, "gpu_uuid": f"GPU-{node}-{index}", "gpu_name": "NVIDIA H100 80GB HBM3",
            "lost": False, **values}


def job_records(job: str, start: dt.datetime = START, ticks: int = TICKS) -> list[dict[str, Any]]:
    """Two hours (``ticks`` of 10 s) from ``start`` (around midnight) on three nodes: n1 two GPUs as
    NVML gives them (whole percents and degrees, mW and mJ), n2 two MIG devices sampled at other
    times, n3 a GPU without energy counter whose values are not whole numbers (the float8
    fallback) and a duplicated tick."""
    records: list[dict[str, Any]] = [
        {"kind": "job_started", "job": job, "ts": _us(start), "node": "n1", "user": "alice", "account": "ml",
         "partition": "gpu", "nodes": ["n1", "n2", "n3"], "gpus": ["0", "1"], "time_limit_s": 14400},
    ]
    for tick in range(ticks):
        busy = tick % 180 >= 12
        for index in (0, 1):
            power_mw = (610_000 + (tick * 7727 + index * 3001) % 90_000) if busy else 95_000 + tick % 7
            records.append(_sample(
                job, tick, "n1", index, start, util_gpu=float(100 - tick % 9 if busy else tick % 4),
                util_mem=float(30 + (tick * 13 + index) % 20), mem_used=(70 + index) * 2**30 + (tick // 60) * 2**21,
                mem_total=80 * 2**30, power_w=power_mw / 1000.0,
                energy_j=(10**9 + index * 10**7 + tick * 650_123 * STEP_S) / 1000.0,
                temp_c=float(60 + tick // 200 + index), sm_clock_mhz=1980 if tick % 50 else 1755, mem_clock_mhz=2619,
                pcie_tx_kbs=(tick * 104_729) % 500_000, pcie_rx_kbs=(tick * 15_485_863) % 900_000,
                throttle_reasons=0 if tick % 50 else 4, ecc_errors=0, process_count=1,
                sm_active=round(70 + (tick * 37 % 2000) / 100, 2), tensor_active=40.25 + tick % 3,
            ))
        if tick % 3 == 0:  # n2's daemon ticks every 30 s, each MIG device its own row
            for mig in ("MIG-a", "MIG-b"):
                records.append({**_sample(job, tick, "n2", 0, start, util_gpu=float(tick % 101), mem_used=tick * 4096,
                                          mem_total=40 * 2**30, power_w=None if tick % 7 == 0 else 250.5,
                                          temp_c=-5.0 if tick % 11 == 0 else 41.0), "mig_uuid": mig})
        # n3: values that no integer encoding keeps, an unsupported counter, a missing reading.
        records.append(_sample(job, tick, "n3", 0, start, util_gpu=87.5 + (tick % 3) / 3,
                               power_w=301.123456789 + tick % 5, temp_c=55.25, mem_used=None,
                               sm_active=1 / 3 if tick % 2 else None))
        records.extend(_host_samples(job, tick, start))
    records.append(_sample(job, 100, "n3", 0, start, util_gpu=12.0, power_w=280.0))  # a second sample at one time
    records.append(_host(job, 100, "n3", start, cpu_util=5.0, cpu_time_s=1.0))  # and a second host sample
    records.append({"kind": "job_ended", "job": job, "ts": _us(start + dt.timedelta(seconds=ticks * STEP_S)),
                    "node": "n1", "exit_code": 0})
    return records


def _host(job: str, tick: int, node: str | None, start: dt.datetime = START, **values: Any) -> dict[str, Any]:
    record = {"kind": "host_sample", "job": job, "ts": _us(start) + tick * STEP_S * S + (tick * 7919) % 1500,
              **values}
    return record if node is None else {**record, "node": node}


def _host_samples(job: str, tick: int, start: dt.datetime) -> list[dict[str, Any]]:
    """n1 and n3 every tick, n2 every third; a value missing now and then, and a sample without
    a node (an agent that could not name its host) every 50th tick."""
    records = [_host(job, tick, node, start, cpu_util=None if tick % 13 == 0 else 640.5 + tick % 7 + index / 3,
                     cpu_time_s=1e4 + tick * 6.4 + index, mem_used=(200 + index) * 2**30 + tick * 4096,
                     mem_limit=None if index and tick % 2 else 512 * 2**30)
               for index, node in enumerate(("n1", "n3"))]
    if tick % 3 == 0:
        records.append(_host(job, tick, "n2", start, cpu_util=97.25, mem_used=2**33))
    if tick % 50 == 0:
        records.append(_host(job, tick, None, start, cpu_util=1.5))
    return records


def late_part(
    records: list[dict[str, Any]], start: dt.datetime = START
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(on time, late): n1 GPU 0's samples of 23:40-23:45 and 00:20-00:21 (minutes 40-45 and
    80-81 from ``start``) arrive after the pass."""
    def late(r: dict[str, Any]) -> bool:
        if r["kind"] not in ("gpu_sample", "host_sample") or r.get("node") != "n1" or r.get("gpu_index", 0) != 0:
            return False
        offset_s = (r["ts"] - _us(start)) / S
        return 2400 <= offset_s < 2700 or 4800 <= offset_s < 4860
    return [r for r in records if not late(r)], [r for r in records if late(r)]


def _post_all(client: Any, records: list[dict[str, Any]]) -> None:
    for i in range(0, len(records), 1000):
        response = post(client, gz(records[i:i + 1000], source=f"test-{uuid.uuid4().hex[:8]}"))
        assert response.status_code == 200, response.text


RECENT = 660
"""The last 180 ticks of the test job (3 samples a tick, 2 more every third tick): the latest
samples are taken whole ticks at a time, as samples sharing a time come in no set order."""


def snapshot(conn: psycopg.Connection[Any], client: Any, job: str, start: dt.datetime = START,
             midnight: dt.datetime = MIDNIGHT) -> dict[str, Any]:
    """Every answer a page, the report or the audit gets about the job (which began at ``start``;
    zooms are around ``midnight``, an hour boundary inside the job). The audit's totals are over
    every job of the period: compare them only at one moment."""
    window = queries.series_range(conn, "gpu_samples", CLUSTER, job)
    host_window = queries.series_range(conn, "host_samples", CLUSTER, job)
    assert window is not None and host_window is not None
    period = (start - dt.timedelta(days=1), start + dt.timedelta(days=1))
    now = start + dt.timedelta(days=1)
    row = client.get(f"/v1/jobs/{job}").json()
    answer = client.get(f"/v1/jobs/{job}/summary").json()
    return {
        "range": (window.start, window.end),
        "host_range": (host_window.start, host_window.end),
        "host": Counter(tuple(r.values()) for r in conn.execute(f"SELECT * FROM {host_tier.samples()} h",
                                                               {"job": job, "cluster": CLUSTER})),
        "host_zoom": Counter(tuple(r.values()) for r in conn.execute(
            f"SELECT * FROM {host_tier.samples(start='%(start)s', end='%(end)s')} h",
            {"job": job, "cluster": CLUSTER, "start": midnight - dt.timedelta(seconds=95),
             "end": midnight + dt.timedelta(seconds=65)})),
        **{f"series_{points}": queries.gpu_series(conn, CLUSTER, job, points=points)
           for points in (5000, 600, 40, 7)},  # 1.5 s to 17 min buckets: samples, then the rollup
        # The heatmap's read of utilisation alone unpacks only that column of a packed hour.
        **{f"utilisation_{points}": queries.gpu_series(conn, CLUSTER, job, points=points, measures=queries.UTILISATION)
           for points in (5000, 40)},
        "zoom": queries.gpu_series(conn, CLUSTER, job, start=midnight - dt.timedelta(seconds=95),
                                   end=midnight + dt.timedelta(seconds=65), points=400),  # 0.4 s buckets
        "zoom_rollup": queries.gpu_series(conn, CLUSTER, job, start=midnight - dt.timedelta(minutes=47),
                                          end=midnight + dt.timedelta(minutes=31), points=20),
        "api_gpu": client.get(f"/v1/jobs/{job}/gpu", params={"points": 300}).json()["series"],
        "summary": summaries.compute_summary(conn, CLUSTER, job),
        "stored_summary": answer["summary"],
        "report": format_report(row, answer).replace(job, "JOB"),
        "recent": Counter(tuple(r.values()) for r in queries.recent_gpu_samples(conn, CLUSTER, job, limit=RECENT)),
        "jobs": [r for r in list_jobs(conn, cluster=CLUSTER, limit=1000)[0] if r["job_id"] == job],
        "audit_rows": [r for r in audit_queries.underused_allocations(conn, *period, below_percent=101, now=now)
                       if r["job_id"] == job],
        "audit": {
            "totals": audit_queries.audit_totals(conn, *period, now=now),
            **{group: audit_queries.gpu_hours_by(conn, group, *period, now=now)  # type: ignore[arg-type]
               for group in ("user_name", "account", "partition")},
            "underused": audit_queries.underused_allocations(conn, *period, below_percent=101, now=now),
            "trend": audit_queries.daily_trend(conn, *period, now=now),
        },
    }


def assert_same(a: Any, b: Any, path: str = "", key: str = "") -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}", str(k))
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]", key)
    elif isinstance(a, float) and isinstance(b, float) and key in SUMS_OF_FLOATS:
        assert math.isclose(a, b, rel_tol=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _without_job(value: Any, job: str) -> Any:
    """The answers about one job, comparable with another's: its id replaced, and the totals over
    every job and the collector's own clock (last_seen) left out."""
    if isinstance(value, dict):
        return {k: _without_job(v, job) for k, v in value.items() if k not in ("last_seen", "first_seen", "audit")}
    if isinstance(value, list):
        return [_without_job(v, job) for v in value]
    return "JOB" if value == job else value


@pytest.fixture(scope="module")
def tier_url(postgres: EmbeddedPostgres) -> str:
    """A database of its own: a pass packs every job's closed days, not just this module's."""
    url = create_database(postgres, f"tiers_{uuid.uuid4().hex[:8]}")
    migrate.upgrade(url)
    return url


@pytest.fixture
def tier_client(tier_url: str, data_dir: Path, admin_token: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    monkeypatch.setenv("JOBSIGHT_COMPACT_INTERVAL_S", "0")  # passes run when the test says
    with TestClient(create_app(load_collector_settings(database_url=tier_url, data_dir=data_dir))) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        yield client


def _pass(conn: psycopg.Connection[Any], **kwargs: Any) -> compaction.PassReport:
    options: dict[str, Any] = {"older_than": dt.timedelta(0), "packed_retention_days": 0, **kwargs}
    return compaction.run_pass(conn, PartitionKeeper(), **options)


def _rows(conn: psycopg.Connection[Any], table: str, day: dt.date) -> int:
    found = conn.execute(f"SELECT count(*) AS n FROM {partition_name(table, day)}").fetchone()
    return int(found["n"]) if found else 0


def test_same_answers_before_and_after_and_late_samples_merge(tier_client: Any, tier_url: str) -> None:
    packed, reference = f"p-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
    on_time, late = late_part(job_records(packed))
    _post_all(tier_client, on_time)
    _post_all(tier_client, job_records(reference))  # every sample on time: what the packed job must match
    days = [START.date(), MIDNIGHT.date()]
    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
        before = snapshot(conn, tier_client, packed)
        expected = _without_job(snapshot(conn, tier_client, reference), reference)
        raw_bytes = conn.execute("SELECT pg_total_relation_size(%s) AS n", (partition_name("gpu_samples", days[0]),))
        assert raw_bytes.fetchone()["n"] > 100_000

        report = _pass(conn)
        assert [d.day for d in report.days] == days and {d.jobs for d in report.days} == {2}
        samples = [r for r in on_time + job_records(reference) if r["kind"] == "gpu_sample"]
        assert sum(d.samples for d in report.days) == len(samples)
        hosts = [r for r in on_time + job_records(reference) if r["kind"] == "host_sample"]
        assert sum(d.host_samples for d in report.days) == len(hosts)
        for day in days:  # the raw partitions are empty (their files given back) but still there
            for table in compaction.RAW_TABLES:
                assert _rows(conn, table, day) == 0
                size = conn.execute("SELECT pg_relation_size(%s) AS n", (partition_name(table, day),))
                assert size.fetchone()["n"] == 0
        assert conn.execute("SELECT count(*) AS n FROM gpu_sample_blocks").fetchone()["n"] > 0
        assert conn.execute("SELECT count(*) AS n FROM host_sample_blocks").fetchone()["n"] > 0
        assert conn.execute("SELECT count(*) AS n FROM pg_trigger WHERE tgname = %s",
                            (compaction.REFUSING_TRIGGER,)).fetchone()["n"] == 0
        assert_same(snapshot(conn, tier_client, packed), before)

        # The late samples arrive after the pass (an outage replayed): they land in the raw
        # partitions, the summary refresh pass recomputes the job's summary over both tiers, every
        # answer counts them.
        _post_all(tier_client, late)
        assert summaries.refresh_marked(conn, 100) == 1
        for kind, table in (("gpu_sample", "gpu_samples"), ("host_sample", "host_samples")):
            assert _rows(conn, table, days[0]) == sum(1 for r in late if r["kind"] == kind and r["ts"] < _us(MIDNIGHT))
        assert_same(_without_job(snapshot(conn, tier_client, packed), packed), expected)

        report = _pass(conn)  # the next pass merges them into the packed hours they belong to
        assert [d.day for d in report.days] == days and {d.jobs for d in report.days} == {1}
        assert all(_rows(conn, t, d) == 0 for t in compaction.RAW_TABLES for d in days)
        assert_same(_without_job(snapshot(conn, tier_client, packed), packed), expected)
        assert _pass(conn).days == []


def test_closed_hours_of_a_running_day_packed_while_samples_keep_arriving(tier_client: Any, tier_url: str) -> None:
    """A job running at ``now`` (14:40 yesterday for the pass: any hour of the wall clock gives the
    same test): the pass packs its closed hours of the day, which is not over, while the current
    hour's batches keep coming and are stored, and a late batch for a packed hour is answered 503
    (sent again after); late samples land raw and are merged by the next pass; every answer (grid,
    series, summary, report, audit) stays the one a job whose samples were never packed gets."""
    now = dt.datetime.combine(NOW.date() - dt.timedelta(days=1), dt.time(14, 40), dt.UTC)
    hour = compaction.hour_floor(now)
    start = hour - dt.timedelta(hours=2)  # two closed hours, then the current one up to a minute ago
    ticks = int((now - dt.timedelta(minutes=1) - start) / dt.timedelta(seconds=STEP_S))
    packed, reference = f"lp-{uuid.uuid4().hex[:8]}", f"lr-{uuid.uuid4().hex[:8]}"
    on_time, late = late_part(job_records(packed, start, ticks), start)
    current = [r for r in on_time if r["ts"] >= _us(hour) and r["kind"] != "job_started"]
    closed = [r for r in on_time if r["ts"] < _us(hour) or r["kind"] == "job_started"]
    _post_all(tier_client, closed)
    _post_all(tier_client, job_records(reference, start, ticks))
    snap = {"start": start, "midnight": hour - dt.timedelta(hours=1)}
    errors: list[BaseException] = []
    reports: list[compaction.PassReport] = []

    def one_pass() -> None:
        try:
            with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
                reports.append(_pass(conn, now=now))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn, \
            psycopg.connect(tier_url, autocommit=True) as holder:
        expected = _without_job(snapshot(conn, tier_client, reference, **snap), reference)
        # The pass is held inside its packing transaction (its first write waits for this lock), its
        # refusal of the span in place: what ingest meets while a pass runs, for as long as we look.
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE gpu_devices IN EXCLUSIVE MODE")
        worker = threading.Thread(target=one_pass)
        worker.start()
        for _ in range(600):
            if conn.execute("SELECT count(*) AS n FROM pg_trigger WHERE tgname = %s",
                            (compaction.REFUSING_TRIGGER,)).fetchone()["n"]:
                break
            time.sleep(0.05)
        for i in range(0, len(current), 200):  # the current hour's batches: stored
            response = post(tier_client, gz(current[i:i + 200], source=f"cur-{i}"))
            assert response.status_code == 200, response.text
        refused = post(tier_client, gz(late[:10], source="late-early", seq=1))  # a packed hour's: later
        assert refused.status_code == 503 and "Retry-After" in refused.headers, refused.text
        holder.execute("COMMIT")
        worker.join()
        assert not errors and reports[0].ran
        assert [(d.until, d.whole) for d in reports[0].days if d.day == hour.date()] == [(hour, False)]
        assert_same(_without_job(snapshot(conn, tier_client, reference, **snap), reference), expected)

        _post_all(tier_client, late)  # an outage's spool, replayed into hours already packed
        summaries.refresh_marked(conn, 100)  # the summary refresh pass
        assert_same(_without_job(snapshot(conn, tier_client, packed, **snap), packed), expected)
        _pass(conn, now=now)  # merges them into their hours' blocks
        assert_same(_without_job(snapshot(conn, tier_client, packed, **snap), packed), expected)
        for job in (packed, reference):
            raw = conn.execute("SELECT count(*) FILTER (WHERE ts < %(hour)s) AS closed, count(*) AS n "
                               "FROM gpu_samples WHERE job_id = %(job)s", {"job": job, "hour": hour}).fetchone()
            assert raw == {"closed": 0, "n": sum(1 for r in current if r["kind"] == "gpu_sample")}
            hours = conn.execute("SELECT count(DISTINCT ts) AS n FROM gpu_sample_blocks WHERE job_id = %s",
                                 (job,)).fetchone()
            assert hours["n"] == 2
        assert conn.execute("SELECT count(*) AS n FROM pg_trigger WHERE tgname = %s",
                            (compaction.REFUSING_TRIGGER,)).fetchone()["n"] == 0


def test_a_day_being_packed_refuses_late_rows_with_a_retry(tier_client: Any, tier_url: str) -> None:
    """While a pass packs a day, a batch for that day is answered 503 (its agent sends it again)
    and the other batches of the moment are stored; the pass lifts the refusal when it ends,
    and a pass that died before lifting it is cleaned up by the next one."""
    job = f"l-{uuid.uuid4().hex[:8]}"
    day = (NOW - dt.timedelta(days=4)).date()
    late = [_sample(job, 0, "n1", 0, util_gpu=50.0) | {"ts": _us(dt.datetime.combine(day, dt.time(12), dt.UTC))}]
    today = [_sample(job, 0, "n1", 0, util_gpu=60.0) | {"ts": _us(NOW - dt.timedelta(minutes=1))}]
    keeper = PartitionKeeper()
    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
        for table in compaction.RAW_TABLES:
            keeper.ensure(conn, table, [day])
        day_end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)
        for table in compaction.RAW_TABLES:  # what compact_day does first, left behind by a killed pass
            conn.execute(sql.SQL(compaction._REFUSE_ROWS).format(
                sql.Identifier(compaction.REFUSING_TRIGGER), sql.Identifier(partition_name(table, day)),
                sql.Literal(day_end)))
        refused = post(tier_client, gz(late, source="late-source", seq=1))
        assert refused.status_code == 503 and "Retry-After" in refused.headers
        assert post(tier_client, gz(today)).status_code == 200

        _pass(conn, older_than=dt.timedelta(days=30))  # packs nothing, lifts the stray refusal
        assert post(tier_client, gz(late, source="late-source", seq=1)).status_code == 200
        assert _rows(conn, "gpu_samples", day) == 1


def test_a_refusal_that_cannot_be_lifted_now_waits_for_the_next_pass(tier_url: str) -> None:
    """Lifting a refusal takes the partition's strongest lock, which would queue the running day's
    inserts behind a long read: the pass waits a moment, leaves it (it refuses only rows of packed
    hours) and the next pass lifts it."""
    job = f"b-{uuid.uuid4().hex[:8]}"
    day = (NOW - dt.timedelta(days=7)).date()
    eight = dt.datetime.combine(day, dt.time(8), dt.UTC)
    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn, \
            psycopg.connect(tier_url, autocommit=True) as reader:
        _raw_samples(conn, job, day)
        reader.execute("BEGIN")
        reader.execute(f"SELECT count(*) FROM {partition_name('host_samples', day)}")  # a long read, still open
        report = _pass(conn, now=eight - dt.timedelta(minutes=30))  # packs 06:00, the day still running
        assert [(d.day, d.until, d.whole) for d in report.days] == [(day, eight - dt.timedelta(hours=1), False)]
        left = conn.execute("SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                            "WHERE t.tgname = %s", (compaction.REFUSING_TRIGGER,)).fetchall()
        assert [r["relname"] for r in left] == [partition_name("host_samples", day)]
        reader.execute("COMMIT")
        _pass(conn, now=eight - dt.timedelta(minutes=30))
        assert conn.execute("SELECT count(*) AS n FROM pg_trigger WHERE tgname = %s",
                            (compaction.REFUSING_TRIGGER,)).fetchone()["n"] == 0
        assert sum(r["samples"] for r in queries.gpu_series(conn, CLUSTER, job, points=5000)) == 1440


def test_one_pass_at_a_time(tier_url: str) -> None:
    with psycopg.connect(tier_url, autocommit=True) as holder, \
            psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
        holder.execute("SELECT pg_advisory_lock(%s)", (compaction.COMPACTION_LOCK_KEY,))
        assert _pass(conn).ran is False
        holder.execute("SELECT pg_advisory_unlock(%s)", (compaction.COMPACTION_LOCK_KEY,))
        assert _pass(conn).ran is True


def _raw_samples(conn: psycopg.Connection[Any], job: str, day: dt.date, hours: int = 2) -> None:
    """Rows written around the ingest path, as a bulk load does (with their rollup)."""
    from jobsight.collector.tiers.rollup import rebuild_minutes

    keeper = PartitionKeeper()
    for table in compaction.RAW_TABLES:
        keeper.ensure(conn, table, [day])
    params = {"c": CLUSTER, "j": job, "t": dt.datetime.combine(day, dt.time(6), dt.UTC), "n": hours * 3600}
    conn.execute(
        """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, util_gpu, power_w, energy_j)
           SELECT %(c)s, %(j)s, %(t)s + make_interval(secs => t), 'n1', g, 'GPU-' || g, t %% 100, 300 + g,
                  1000 + t * 300
           FROM generate_series(0, %(n)s - 1, 10) t, generate_series(0, 1) g""",
        params,
    )
    conn.execute(
        """INSERT INTO host_samples (cluster, job_id, ts, node, cpu_util, cpu_time_s, mem_used, mem_limit)
           SELECT %(c)s, %(j)s, %(t)s + make_interval(secs => t), 'n1', 800 + t %% 50, t * 8.0, 2^34 + t, 2^39
           FROM generate_series(0, %(n)s - 1, 10) t""",
        params,
    )
    rebuild_minutes(conn, CLUSTER, job)


def test_hot_minutes_stay_row_per_sample(tier_url: str) -> None:
    """An hour is packed once it has been over ``older_than``: the next hour stays raw, then goes
    too, its rows deleted from the day's partition (the day is not over); every sample is read
    once at each step."""
    job = f"h-{uuid.uuid4().hex[:8]}"
    day = (NOW - dt.timedelta(days=5)).date()
    eight = dt.datetime.combine(day, dt.time(8), dt.UTC)  # the job's samples are 06:00-08:00
    hot = dt.timedelta(minutes=15)
    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
        _raw_samples(conn, job, day)
        one_packed = _pass(conn, older_than=hot, now=eight + dt.timedelta(minutes=14))
        spans = [d for d in one_packed.days if d.day == day]
        assert [(d.until, d.whole, d.samples, d.raw_rows) for d in spans] == [
            (eight - dt.timedelta(hours=1), False, 720, 720 + 360 + 2 * 60)]  # samples, host samples, minutes
        assert _rows(conn, "gpu_samples", day) == 720 and _rows(conn, "host_samples", day) == 360
        assert sum(r["samples"] for r in queries.gpu_series(conn, CLUSTER, job, points=5000)) == 1440
        both = _pass(conn, older_than=hot, now=eight + dt.timedelta(minutes=15))
        assert [(d.until, d.whole) for d in both.days if d.day == day] == [(eight, False)]
        assert _rows(conn, "gpu_samples", day) == 0 and _rows(conn, "gpu_minutes", day) == 0
        assert sum(r["samples"] for r in queries.gpu_series(conn, CLUSTER, job, points=5000)) == 1440
        blocks = conn.execute("SELECT count(*) AS n FROM gpu_sample_blocks WHERE job_id = %s", (job,)).fetchone()
        assert blocks["n"] == 4  # two GPUs, two hours: the second pass added its hour's, left the first's
        day_over = _pass(conn, older_than=hot, now=eight + dt.timedelta(hours=17))
        assert day not in [d.day for d in day_over.days]  # nothing raw is left to pack


def test_each_tier_keeps_its_partitions_by_its_own_rules(tier_url: str) -> None:
    """Raw partitions of a packed day stay while a late record could still reach them, and go
    (empty) after; packed partitions go after the packed tier's retention; a raw partition
    that still holds rows is never dropped for being old, it is packed first."""
    job = f"t-{uuid.uuid4().hex[:8]}"
    old_day = (NOW - dt.timedelta(days=20)).date()
    recent_day = (NOW - dt.timedelta(days=6)).date()
    expired_day = (NOW - dt.timedelta(days=200)).date()
    keeper = PartitionKeeper()
    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
        _raw_samples(conn, job, old_day)
        _raw_samples(conn, job, recent_day)
        for table in ("gpu_sample_blocks", "gpu_sample_timelines", "gpu_minute_blocks", "host_sample_blocks"):
            keeper.ensure(conn, table, [expired_day])
        report = _pass(conn, packed_retention_days=180)
        assert {old_day, recent_day} <= {d.day for d in report.days}
        gone = set(report.dropped)
        assert {partition_name(t, old_day) for t in compaction.RAW_TABLES} <= gone
        assert not {partition_name(t, recent_day) for t in compaction.RAW_TABLES} & gone
        assert {partition_name(t, expired_day) for t in ("gpu_sample_blocks", "host_sample_blocks")} <= gone
        assert not {partition_name(t, old_day) for t in ("gpu_sample_blocks", "host_sample_blocks")} & gone
        series = queries.gpu_series(conn, CLUSTER, job, points=5000)
        assert sum(r["samples"] for r in series) == 2 * 1440


def test_the_command_packs_now(tier_url: str, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    job = f"c-{uuid.uuid4().hex[:8]}"
    day = (NOW - dt.timedelta(days=3)).date()
    monkeypatch.setenv("JOBSIGHT_DATABASE_URL", tier_url)
    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
        _raw_samples(conn, job, day)
        assert cli_main(["compact", "--older-than", "4d"]) == 0
        assert _rows(conn, "gpu_samples", day) == 1440
        assert cli_main(["compact", "--older-than", "0s"]) == 0
        assert _rows(conn, "gpu_samples", day) == 0
    said = capsys.readouterr().out
    assert "nothing to pack" in said and f"{day}: 1 jobs, 1,440 samples in 4 blocks" in said
    with pytest.raises(SystemExit) as refused:
        cli_main(["compact", "--older-than", "3 days"])
    assert refused.value.code == 2


def test_a_pass_and_ingest_at_once(tier_client: Any, tier_url: str) -> None:
    """Batches keep being stored (today's and late ones) while passes run."""
    job = f"x-{uuid.uuid4().hex[:8]}"
    day = (NOW - dt.timedelta(days=5)).date()
    base = dt.datetime.combine(day, dt.time(3), dt.UTC)
    errors: list[BaseException] = []

    def passes() -> None:
        try:
            with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
                for _ in range(3):
                    _pass(conn)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=passes)
    worker.start()
    sent = 0
    for batch in range(12):
        records = [_sample(job, 0, "n1", 0, util_gpu=float(i % 100))
                   | {"ts": _us(base + dt.timedelta(seconds=batch * 100 + i))} for i in range(100)]
        for _ in range(300):  # a 503 is sent again, as the agent does
            response = post(tier_client, gz(records, source="x-source", seq=batch + 1))
            if response.status_code != 503:
                break
            time.sleep(0.05)
        assert response.status_code == 200, response.text
        sent += len(records)
    worker.join()
    assert not errors
    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
        _pass(conn)
        series = queries.gpu_series(conn, CLUSTER, job, points=5000)
    assert sum(r["samples"] for r in series) == sent


def test_downgrade_puts_packed_rows_back(empty_database_url: str) -> None:
    """The downgrades of migrations 0008 and 0004 unpack the packed tier into host_samples,
    gpu_samples and gpu_minutes (making their partitions again) before they drop the packed tables."""
    job = f"d-{uuid.uuid4().hex[:8]}"
    day = (NOW - dt.timedelta(days=40)).date()
    migrate.upgrade(empty_database_url)
    columns = "ts, node, gpu_index, gpu_uuid, util_gpu, power_w, energy_j"
    # The columns 0008 knew: the later ones (0014's node energy) go with their own downgrade.
    hosts = ("SELECT cluster, job_id, ts, node, cpu_util, cpu_time_s, mem_used, mem_limit FROM host_samples "
             "ORDER BY ts, node NULLS FIRST, cpu_util")
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        _raw_samples(conn, job, day)
        conn.execute(
            """INSERT INTO host_samples (cluster, job_id, ts, node, cpu_util, cpu_time_s, mem_used, mem_limit)
               SELECT %(c)s, %(j)s, %(t)s + make_interval(secs => t), nullif('n' || (t %% 3), 'n2'),
                      CASE WHEN t %% 7 = 0 THEN NULL ELSE t / 3.0 END, t * 1.5, t * 4096, NULL
               FROM generate_series(0, 7199, 10) t""",
            {"c": CLUSTER, "j": job, "t": dt.datetime.combine(day, dt.time(6), dt.UTC)},
        )
        samples = conn.execute(f"SELECT {columns} FROM gpu_samples ORDER BY ts, gpu_index").fetchall()
        minutes = conn.execute("SELECT * FROM gpu_minutes ORDER BY ts, gpu_index").fetchall()
        host_rows = conn.execute(hosts).fetchall()
        _pass(conn)
        assert conn.execute("SELECT count(*) AS n FROM host_sample_blocks").fetchone()["n"] > 0
        assert conn.execute("SELECT to_regclass(%s) AS t", (partition_name("gpu_samples", day),)).fetchone() == {
            "t": None}
    migrate.downgrade(empty_database_url, "0003")
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        assert conn.execute(f"SELECT {columns} FROM gpu_samples ORDER BY ts, gpu_index").fetchall() == samples
        assert conn.execute("SELECT * FROM gpu_minutes ORDER BY ts, gpu_index").fetchall() == minutes
        assert conn.execute(hosts).fetchall() == host_rows
    migrate.upgrade(empty_database_url)
    assert migrate.autogenerate_diff(empty_database_url) == []


def test_gpu_uses_outside_any_job_are_kept_as_long_as_the_packed_tier(tier_url: str) -> None:
    """``gpu_unallocated_uses`` is not partitioned: the pass deletes its rows past the packed retention."""
    now = dt.datetime.now(dt.UTC)
    with psycopg.connect(tier_url, autocommit=True, row_factory=dict_row) as conn:
        for days_ago, pid in ((31, 1), (29, 2), (0, 3)):
            seen = now - dt.timedelta(days=days_ago)
            conn.execute("INSERT INTO gpu_unallocated_uses (cluster, node, ts, gpu_index, gpu_uuid, pid) "
                         "VALUES ('default', 'n-retained', %s, 0, 'GPU-x', %s)", (seen, pid))
        assert _pass(conn, packed_retention_days=0, now=now).unallocated_deleted == 0  # 0 keeps everything
        report = _pass(conn, packed_retention_days=30, now=now)
        kept = conn.execute("SELECT pid FROM gpu_unallocated_uses WHERE node = 'n-retained' ORDER BY pid").fetchall()
    assert report.unallocated_deleted == 1
    assert [row["pid"] for row in kept] == [2, 3]
