"""jobsight on a real Citus cluster (a coordinator and two workers, tests/citus/cluster.py), every
answer compared with a single PostgreSQL 15 server holding the same records.

Both get the schema from ``jobsight migrate`` (the cluster with ``--citus``), a real collector
process each, and the same records of every kind through the real shipper (tests/citus/dataset.py).
Then every read endpoint, the report, the job page's and the audit's queries, compaction,
retention and the partition a late day needs are run on both and must answer alike.

Skipped where Citus is not installed (tests/citus/build_citus.sh builds it; CI runs it), unless
``JOBSIGHT_REQUIRE_CITUS=1`` (CI), where that fails instead.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.collector.config.alerts import load_alert_settings
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.passes import alerts
from jobsight.collector.passes.findings import HealthEvaluator
from jobsight.collector.query import audit as audit_queries
from jobsight.collector.query import findings as finding_queries
from jobsight.collector.query import grids as dashboard_data
from jobsight.collector.query import logs as log_queries
from jobsight.collector.query import profiles as profile_queries
from jobsight.collector.query import series as queries
from jobsight.collector.store.citus import LOCAL_TABLES, REFERENCE_TABLES
from jobsight.collector.store.partitions import PartitionKeeper, partition_name
from jobsight.collector.tiers import compaction
from tests.citus.cluster import skip_or_fail_without_citus, start_citus_cluster, start_single_server
from tests.citus.dataset import HOURS_JOB_START, all_records, day_start
from tests.conftest import REPO, LiveCollector

CLUSTER = "default"
# Columns whose values a server picks for itself (row ids, arrival times): not the answer's content.
SERVER_PICKED = frozenset({"id", "first_seen", "last_seen", "created_at", "updated_at", "received_at",
                           "profile_row_id", "row_id", "trace_url", "computed_at"})


@dataclass
class Side:
    """One database with its collector: the single server or the Citus coordinator."""

    name: str
    url: str
    collector: LiveCollector
    now: dt.datetime
    """When the records were made (the same on both sides)."""

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.collector.url}{path}", params=params,
                             headers={"Authorization": f"Bearer {self.collector.token}"}, timeout=60)
        assert response.status_code == 200, f"{self.name} {path}: {response.status_code} {response.text[:500]}"
        return response.json() if response.headers.get("content-type", "").startswith("application/json") else (
            response.content)

    def read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with psycopg.connect(self.url, row_factory=dict_row, autocommit=True) as conn:
            return fn(conn, *args, **kwargs)


def _migrate(url: str, *extra: str) -> str:
    result = subprocess.run([sys.executable, "-m", "jobsight", "migrate", *extra], capture_output=True, text=True,
                            env={**os.environ, "JOBSIGHT_DATABASE_URL": url}, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _ship(collector: LiveCollector, spool: Path, records: list[dict[str, Any]]) -> None:
    settings = AgentSettings(url=collector.url, token=collector.token, spool_dir=str(spool), node="cn0",
                             batch_age_s=0.05, http_timeout_s=30.0)
    shipper = Shipper(settings)
    try:
        for record in records:
            shipper.enqueue(dict(record))
        assert shipper.flush(120.0), shipper.stats()
        assert shipper.stats().get("rejected", 0) == 0, shipper.stats()
    finally:
        shipper.shutdown(10.0)


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, admin_token: str) -> Iterator[tuple[Side, Side]]:
    skip_or_fail_without_citus()
    base = tmp_path_factory.mktemp("citus")
    base.chmod(0o755)
    single = start_single_server(base)
    cluster = start_citus_cluster(base)
    collectors: list[LiveCollector] = []
    now = dt.datetime.now(dt.UTC)
    try:
        _migrate(single.url)
        first = _migrate(cluster.url, "--citus")
        assert "placed now: jobs," in first
        again = _migrate(cluster.url, "--citus")
        assert "placed now: none (already distributed)" in again  # idempotent
        result = []
        for name, url in (("single", single.url), ("citus", cluster.url)):
            # The test runs compaction and health evaluation itself, on both sides alike.
            collector = LiveCollector(url, data_dir, admin_token, base / f"{name}-collector.log",
                                      env={"JOBSIGHT_COMPACT_INTERVAL_S": "0", "JOBSIGHT_RETENTION_DAYS": "0",
                                           "JOBSIGHT_HEALTH_INTERVAL_S": "0"})
            collector.start()
            collectors.append(collector)
            result.append(Side(name, url, collector, now))
        records = all_records(now)
        for side in result:
            for job, job_records in records.items():
                _ship(side.collector, base / f"spool-{side.name}-{job}", job_records)
        yield result[0], result[1]
    finally:
        for collector in collectors:
            collector.kill()
        cluster.destroy()
        single.destroy()


def normalised(value: Any) -> Any:
    """``value`` without the columns a server picks for itself, lists of rows in a stable order."""
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items() if k not in SERVER_PICKED}
    if isinstance(value, list):
        items = [normalised(v) for v in value]
        return items
    if hasattr(value, "to_dict"):  # a DataFrame from the dashboard's queries
        return normalised(value.to_dict(orient="records"))
    return value


def assert_same(single: Any, citus: Any, what: str) -> None:
    left, right = normalised(single), normalised(citus)
    assert left == right, (f"{what}: single server and Citus differ\n"
                           f"single: {str(left)[:1500]}\ncitus:  {str(right)[:1500]}")
    assert left not in (None, [], {}, b""), f"{what}: empty on both (the comparison would prove nothing)"


# -- placement --------------------------------------------------------------------------------


def test_every_table_with_job_id_is_distributed_by_it_and_the_local_ones_are_named(sides: tuple[Side, Side]) -> None:
    _, citus = sides
    with psycopg.connect(citus.url, autocommit=True) as conn:
        placed = {row[0]: row[1:] for row in conn.execute(
            """SELECT table_name::text, citus_table_type, distribution_column, colocation_id FROM citus_tables""")}
        tables = {row[0] for row in conn.execute(
            """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition""")}
        with_job_id = {row[0] for row in conn.execute(
            """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'job_id'
               WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition""")}
        shards = conn.execute(
            """SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = 'gpu_samples'::regclass"""
        ).fetchone()
    # What is left local, each on purpose (jobsight.collector.store.citus.LOCAL_TABLES says why).
    assert tables - set(placed) == set(LOCAL_TABLES) == {"alembic_version"}
    jobs_colocation = placed["jobs"][2]
    for table in with_job_id:
        kind, column, colocation = placed[table]
        assert (kind, column, colocation) == ("distributed", "job_id", jobs_colocation), table
    assert placed["ingest_batches"][:2] == ("distributed", "source")
    assert {t for t, (kind, _, _) in placed.items() if kind == "reference"} >= set(REFERENCE_TABLES)
    assert shards is not None and shards[0] == 2  # gpu_samples' shards are on both workers


def test_one_jobs_samples_sit_together_in_one_shard(sides: tuple[Side, Side]) -> None:
    _, citus = sides
    with psycopg.connect(citus.url, autocommit=True) as conn:
        rows = conn.execute(
            """SELECT job_id, count(DISTINCT get_shard_id_for_distribution_column('gpu_samples', job_id)),
                      count(*) FROM gpu_samples GROUP BY job_id ORDER BY job_id""").fetchall()
    assert rows and all(shards == 1 and count > 0 for _, shards, count in rows), rows


# -- the same answers -------------------------------------------------------------------------

JOBS = ("cit-today", "cit-old", "cit-late")  # and cit-hung, for the health test


def test_the_job_list_and_every_job_endpoint_answer_alike(sides: tuple[Side, Side]) -> None:
    single, citus = sides
    for params in ({}, {"user": "bob"}, {"state": "completed"}, {"partition": "debug"}):
        assert_same(single.get("/v1/jobs", **params), citus.get("/v1/jobs", **params), f"/v1/jobs {params}")
    for job in JOBS:
        for path in ("", "/gpu", "/metrics", "/steps", "/logs", "/summary", "/epochs", "/profiles", "/diagnosis"):
            assert_same(single.get(f"/v1/jobs/{job}{path}"), citus.get(f"/v1/jobs/{job}{path}"), f"{job}{path}")
        assert_same(single.get(f"/v1/jobs/{job}/logs", level="WARNING"),
                    citus.get(f"/v1/jobs/{job}/logs", level="WARNING"), f"{job} warnings")
        traces = [side.get(side.get(f"/v1/jobs/{job}/profiles")["profiles"][0]["trace_url"]) for side in sides]
        assert_same(traces[0], traces[1], f"{job} trace")


def test_findings_and_profile_requests_answer_alike(sides: tuple[Side, Side]) -> None:
    single, citus = sides
    for side in sides:
        response = httpx.post(f"{side.collector.url}/v1/jobs/cit-today/profile-requests",
                              json={"steps": 5, "ranks": [0]},
                              headers={"Authorization": f"Bearer {side.collector.token}"}, timeout=30)
        assert response.status_code == 201, response.text
    assert_same(single.get("/v1/jobs/cit-today/profile-requests"), citus.get("/v1/jobs/cit-today/profile-requests"),
                "profile requests")
    # Findings come from each collector's own evaluator pass: equal, whatever they hold.
    for job in JOBS:
        assert normalised(single.get(f"/v1/jobs/{job}/findings")) == normalised(citus.get(f"/v1/jobs/{job}/findings"))
    assert normalised(single.get("/v1/findings")) == normalised(citus.get("/v1/findings"))


def test_health_findings_and_their_alerts_alike(sides: tuple[Side, Side]) -> None:
    """One evaluation pass on each side at the same moment: the silent rank is found on both, and
    its alert is queued for the same sinks."""
    alert_settings = load_alert_settings(sinks=[{"name": "ops", "url": "json://127.0.0.1:9/"}], group_window_s=0)

    def enqueue(conn: Any, finding: Any, event: str, job: Any) -> None:
        alerts.enqueue(conn, alert_settings, finding, event, job)

    health = HealthEvaluator(load_health_settings(hung_min_s=5), enqueue)
    opened = []
    for side in sides:
        evaluation = side.read(health.evaluate_once, side.now.timestamp())
        opened.append(sorted((f["job_id"], f["rule"], f["subject"]) for f in evaluation.opened))
    assert opened[0] == opened[1] and ("cit-hung", "hung_rank", "rank 1") in opened[0], opened
    single, citus = sides
    assert_same(single.get("/v1/jobs/cit-hung/findings"), citus.get("/v1/jobs/cit-hung/findings"), "hung findings")
    outbox = [side.read(lambda conn: conn.execute(
        "SELECT job_id, sink, event FROM alert_outbox ORDER BY job_id, sink, event").fetchall()) for side in sides]
    assert_same(outbox[0], outbox[1], "alert outbox")


def test_the_job_page_and_audit_queries_answer_alike(sides: tuple[Side, Side]) -> None:
    single, citus = sides
    for job in JOBS:
        for read, args in ((dashboard_data.read_gpu_grid, (CLUSTER, job, 200, 16)),
                           (dashboard_data.read_step_grid, (CLUSTER, job, 200, 16)),
                           (dashboard_data.read_metric_grid, (CLUSTER, job, 200, 16)),
                           (queries.epoch_starts, (CLUSTER, job)),
                           (profile_queries.profile_windows, (CLUSTER, job))):
            assert_same(single.read(read, *args), citus.read(read, *args), f"{job} {read.__name__}")
        warnings = {"level": "WARNING", "limit": 200}
        assert_same(single.read(log_queries.log_events, CLUSTER, job, **warnings),
                    citus.read(log_queries.log_events, CLUSTER, job, **warnings), f"{job} log markers")
        assert normalised(single.read(finding_queries.job_findings, CLUSTER, job)) == normalised(
            citus.read(finding_queries.job_findings, CLUSTER, job))
    start, end = day_start(7), dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    # One "now" for both: a running job's GPU-hours grow with it.
    at = {"cluster": CLUSTER, "now": single.now + dt.timedelta(minutes=1)}
    for group in ("user_name", "account", "partition"):
        assert_same(single.read(audit_queries.gpu_hours_by, group, start, end, **at),
                    citus.read(audit_queries.gpu_hours_by, group, start, end, **at), f"audit by {group}")
    assert_same(single.read(audit_queries.audit_totals, start, end, **at),
                citus.read(audit_queries.audit_totals, start, end, **at), "audit totals")
    assert_same(single.read(audit_queries.underused_allocations, start, end, below_percent=95.0, **at),
                citus.read(audit_queries.underused_allocations, start, end, below_percent=95.0, **at),
                "underused allocations")
    assert_same(single.read(audit_queries.daily_trend, start, end, low_util_percent=70.0, **at),
                citus.read(audit_queries.daily_trend, start, end, low_util_percent=70.0, **at), "daily trend")


def test_the_report_reads_alike(sides: tuple[Side, Side]) -> None:
    outputs = []
    for side in sides:
        result = subprocess.run([sys.executable, "-m", "jobsight", "report", "cit-old"], capture_output=True,
                                text=True, timeout=60, cwd=REPO,
                                env={**os.environ, "JOBSIGHT_URL": side.collector.url,
                                     "JOBSIGHT_TOKEN": side.collector.token})
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] and "cit-old" in outputs[0]


# -- partitions, compaction, retention ---------------------------------------------------------


def test_a_late_day_got_its_partition_on_both(sides: tuple[Side, Side]) -> None:
    late_day = day_start(5).date()
    for side in sides:
        with psycopg.connect(side.url, autocommit=True) as conn:
            keeper = PartitionKeeper()
            keeper.load(conn)
            assert keeper.exists("gpu_samples", late_day), side.name
            name = partition_name("gpu_samples", late_day)
            count = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()
            assert count is not None and count[0] > 0, side.name


def _hours_answers(side: Side) -> dict[str, Any]:
    job = "cit-hours"
    return {"gpu": side.get(f"/v1/jobs/{job}/gpu"), "summary": side.get(f"/v1/jobs/{job}/summary"),
            "grid": side.read(dashboard_data.read_gpu_grid, CLUSTER, job, 200, 16)}


def test_closed_hours_of_a_running_day_packed_alike(sides: tuple[Side, Side]) -> None:
    """The hourly pass on a day not over: cit-hours' 14:00 hour is packed and its raw rows deleted
    (distributed DELETEs through the refusing trigger's WHEN), its 15:00 rows stay raw; both
    servers pack the same and answer as before."""
    single, citus = sides
    until = HOURS_JOB_START(single.now.date()) + dt.timedelta(seconds=90)
    before = {side.name: _hours_answers(side) for side in sides}
    reports = []
    for side in sides:
        with psycopg.connect(side.url, row_factory=dict_row, autocommit=True) as conn:
            keeper = PartitionKeeper()
            keeper.load(conn)
            reports.append(compaction.compact_day(conn, keeper, until.date(), until))
            raw = conn.execute("SELECT count(*) FILTER (WHERE ts < %(until)s) AS packed, count(*) AS kept "
                               "FROM gpu_samples WHERE job_id = 'cit-hours'", {"until": until}).fetchone()
            assert raw is not None and raw["packed"] == 0 and raw["kept"] > 0, (side.name, raw)
            assert conn.execute("SELECT count(*) AS n FROM pg_trigger WHERE tgname = %s",
                                (compaction.REFUSING_TRIGGER,)).fetchone() == {"n": 0}, side.name
    shapes = [(r.until, r.whole, r.jobs, r.samples, r.host_samples, r.raw_rows) for r in reports]
    assert shapes[0] == shapes[1] and not reports[0].whole and reports[0].samples > 0, shapes
    for side in sides:
        assert_same(before[side.name], _hours_answers(side), f"{side.name}: cit-hours before and after its hour")
    assert_same(_hours_answers(single), _hours_answers(citus), "cit-hours, one hour packed")


def test_compaction_then_retention_answer_alike(sides: tuple[Side, Side]) -> None:
    single, citus = sides
    reports = []
    for side in sides:
        with psycopg.connect(side.url, row_factory=dict_row, autocommit=True) as conn:
            keeper = PartitionKeeper()
            keeper.load(conn)
            reports.append(compaction.run_pass(conn, keeper, older_than=dt.timedelta(days=1),
                                               packed_retention_days=0))
    packed = [sorted((str(d.day), d.jobs, d.samples) for d in report.days) for report in reports]
    assert packed[0] == packed[1] and len(packed[0]) >= 2, packed
    for job in JOBS:
        for path in ("/gpu", "/summary"):
            assert_same(single.get(f"/v1/jobs/{job}{path}"), citus.get(f"/v1/jobs/{job}{path}"), f"packed {job}{path}")
        assert_same(single.read(dashboard_data.read_gpu_grid, CLUSTER, job, 200, 16),
                    citus.read(dashboard_data.read_gpu_grid, CLUSTER, job, 200, 16), f"packed {job} grid")
    # Retention: packed days older than 4 days go (cit-late's), on both.
    dropped = []
    for side in sides:
        with psycopg.connect(side.url, row_factory=dict_row, autocommit=True) as conn:
            keeper = PartitionKeeper()
            keeper.load(conn)
            dropped.append(sorted(keeper.drop_older_than(conn, 4, dt.datetime.now(dt.UTC).date(),
                                                         tables=compaction.PACKED_RETENTION_TABLES)))
    assert dropped[0] == dropped[1] and dropped[0], dropped
    late_single, late_citus = single.get("/v1/jobs/cit-late/gpu"), citus.get("/v1/jobs/cit-late/gpu")
    assert normalised(late_single) == normalised(late_citus)
    assert_same(single.get("/v1/jobs/cit-old/gpu"), citus.get("/v1/jobs/cit-old/gpu"), "cit-old after retention")


def test_migrate_citus_on_a_server_without_citus_says_what_to_do(sides: tuple[Side, Side]) -> None:
    single, _ = sides
    result = subprocess.run([sys.executable, "-m", "jobsight", "migrate", "--citus"], capture_output=True, text=True,
                            env={**os.environ, "JOBSIGHT_DATABASE_URL": single.url}, cwd=REPO, timeout=300)
    assert result.returncode == 1
    assert "shared_preload_libraries" in result.stderr and "Traceback" not in result.stderr, result.stderr
