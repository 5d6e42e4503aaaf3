"""Notices are per cluster: the same job id, or the same node name, in two clusters is two notices.

The notices outbox is unique by ``(job_id, key, sink)``. Its keys used to hold no cluster, so job
``4242`` ending in cluster ``a`` and in cluster ``b`` was one job-end report (the second was a silent
"duplicate"), and GPU ``n1/0`` failing in both clusters one suspect alert. Keys now hold the cluster
(``collector/passes/notices.notice_key``). A row written under an old key keeps its meaning for its own
cluster, so an upgrade resends nothing (rows written with SQL as a collector before the change left
them, ``sent_at`` set).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from jobsight.collector.config.alerts import load_alert_settings
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.config.notices import load_notice_settings
from jobsight.collector.passes.notices import notice_key
from jobsight.collector.passes.reports import Reports
from jobsight.collector.passes.suspects import alert_suspects
from tests.collector.test_suspect_drain import xid_jobs

UTC = dt.UTC
ADDRESSES = "mailto://127.0.0.1:9?from=hpc-bot@example.org&to={user}@example.org"


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


def _sent_before_the_upgrade(conn: psycopg.Connection[Any], cluster: str, job_id: str, kind: str, sink: str,
                             key: str) -> None:
    conn.execute("""INSERT INTO notices (cluster, job_id, kind, sink, key, title, lines, sent_at, attempts)
                    VALUES (%s, %s, %s, %s, %s, 'sent before the upgrade', %s, now(), 1)""",
                 (cluster, job_id, kind, sink, key, Jsonb({"lines": []})))


def _ended(conn: psycopg.Connection[Any], cluster: str, job: str, user: str) -> None:
    now = dt.datetime.now(UTC)
    conn.execute("""INSERT INTO jobs (cluster, job_id, user_name, name, state, exit_code, start_time, end_time)
                    VALUES (%s, %s, %s, 'train', 'completed', 0, %s, %s)""",
                 (cluster, job, user, now - dt.timedelta(minutes=30), now - dt.timedelta(minutes=1)))
    conn.execute("""INSERT INTO job_summaries (cluster, job_id, gpu_count, gpu_hours, mean_util, flags, summary)
                    VALUES (%s, %s, 0, 0, NULL, '{}', %s)""", (cluster, job, Jsonb({"gpus": []})))


def test_the_cluster_is_part_of_every_key_and_cannot_run_into_the_rest() -> None:
    assert notice_key("job_end", "default", 0) == "job_end:default:0"
    assert notice_key("suspect", "a", "n1/0", "2026-W48") == "suspect:a:n1/0:2026-W48"
    # A cluster named like a key's parts is still one part.
    assert notice_key("suspect", "a:n1", "0/0", "w") != notice_key("suspect", "a", "n1:0/0", "w")


def test_the_same_job_id_ending_in_two_clusters_is_two_reports(conn: psycopg.Connection[Any]) -> None:
    job, user = f"4242{uuid.uuid4().int % 10**8}", f"u{uuid.uuid4().hex[:8]}"
    clusters = [f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"]
    for cluster in clusters:
        _ended(conn, cluster, job, user)
    reports = Reports(load_notice_settings(job_end_summary="listed", job_end_users=[user]),
                      load_alert_settings(user_address_template=ADDRESSES))
    written = reports.job_end_reports(conn, dt.datetime.now(UTC))
    assert written.count(job) == 2
    rows = conn.execute("SELECT cluster, key FROM notices WHERE job_id = %s ORDER BY cluster", (job,)).fetchall()
    assert [(r["cluster"], r["key"]) for r in rows] == [(c, f"job_end:{c}:0") for c in clusters]


def test_a_report_sent_before_the_upgrade_is_not_sent_again(conn: psycopg.Connection[Any]) -> None:
    """Cluster a's report went out under the old key; b's was lost to it. After the upgrade b's is
    written and a's is not written again."""
    job, user = f"4243{uuid.uuid4().int % 10**8}", f"u{uuid.uuid4().hex[:8]}"
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    for cluster in (a, b):
        _ended(conn, cluster, job, user)
    _sent_before_the_upgrade(conn, a, job, "job_end", f"user:{user}", "job_end:0")
    reports = Reports(load_notice_settings(job_end_summary="listed", job_end_users=[user]),
                      load_alert_settings(user_address_template=ADDRESSES))
    assert reports.job_end_reports(conn, dt.datetime.now(UTC)).count(job) == 1
    rows = conn.execute("SELECT cluster, key FROM notices WHERE job_id = %s ORDER BY id", (job,)).fetchall()
    assert [(r["cluster"], r["key"]) for r in rows] == [(a, "job_end:0"), (b, f"job_end:{b}:0")]


def test_the_same_gpu_failing_in_two_clusters_is_two_alerts(conn: psycopg.Connection[Any]) -> None:
    now, node = dt.datetime.now(UTC), f"n{uuid.uuid4().hex[:8]}"
    a, b, c = (f"{x}-{uuid.uuid4().hex[:6]}" for x in "abc")
    for cluster in (a, b, c):
        xid_jobs(conn, cluster, node, 0, ["alice", "bob", "carol"], now)
    year, week, _ = now.isocalendar()
    # Cluster c's alert of this week went out before the upgrade, under the key without a cluster.
    _sent_before_the_upgrade(conn, c, "", "suspect", "ops", f"suspect:{node}/0:{year}-W{week:02d}")
    health = load_health_settings(suspect_alert_jobs=3)
    alerts = load_alert_settings(sinks=[{"name": "ops", "url": "json://localhost:9/hook"}])
    alert_suspects(conn, health, alerts, now.timestamp())
    assert alert_suspects(conn, health, alerts, now.timestamp()) == 0  # a second run: nothing new
    rows = conn.execute("SELECT cluster, key FROM notices WHERE kind = 'suspect' AND key LIKE %s ORDER BY cluster",
                        (f"%{node}%",)).fetchall()
    assert [(r["cluster"], r["key"]) for r in rows] == [
        (a, f"suspect:{a}:{node}/0:{year}-W{week:02d}"), (b, f"suspect:{b}:{node}/0:{year}-W{week:02d}"),
        (c, f"suspect:{node}/0:{year}-W{week:02d}")]
