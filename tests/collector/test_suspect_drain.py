"""A drain is suggested only for a GPU that hurt several jobs.

One job that died with an Xid 79 on a GPU is as likely bad luck, or the job's own doing, as a broken
GPU, and a drain takes the node from everyone: the suspect list, its API and its alert suggest
``scontrol … State=DRAIN`` only for a GPU that hurt at least the site's ``suspect_alert_jobs``
distinct jobs (3 by default); under it the GPU is listed as worth watching. Rows are written with SQL
as the collector stores them (``jobs``, ``gpu_events``), in a cluster of each test's own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.config.alerts import load_alert_settings
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.passes.suspects import alert_suspects
from jobsight.collector.query.suspects import suspect_gpus
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import PARTITIONED_TABLES

UTC = dt.UTC


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


def xid_jobs(conn: psycopg.Connection[Any], cluster: str, node: str, gpu: int, users: list[str],
             now: dt.datetime, code: int = 79) -> list[str]:
    """One ended job per user, each with one Xid ``code`` on ``node``'s GPU ``gpu`` an hour apart."""
    keeper = PartitionKeeper()
    days = {(now - dt.timedelta(hours=n + 1)).date() for n in range(len(users))} | {now.date()}
    for table in PARTITIONED_TABLES:
        keeper.ensure(conn, table, days)
    jobs = []
    for n, user in enumerate(users):
        job, at = f"j{uuid.uuid4().hex[:10]}", now - dt.timedelta(hours=n + 1)
        conn.execute("""INSERT INTO jobs (cluster, job_id, user_name, nodes, node_count, gpus, start_time, end_time,
                                          state, exit_code, last_seen)
                        VALUES (%s, %s, %s, %s, 1, %s, %s, %s, 'failed', 1, %s)""",
                     (cluster, job, user, [node], [f"{node}:{gpu}"], at - dt.timedelta(minutes=30), at, at))
        conn.execute("""INSERT INTO gpu_events (cluster, job_id, ts, node, gpu_index, gpu_uuid, event, code)
                        VALUES (%s, %s, %s, %s, %s, %s, 'xid', %s)""",
                     (cluster, job, at, node, gpu, f"GPU-{node}-{gpu}", code))
        jobs.append(job)
    return jobs


def test_a_gpu_that_hurt_one_job_is_worth_watching_not_drained(conn: psycopg.Connection[Any]) -> None:
    cluster, now = f"drain-{uuid.uuid4().hex[:8]}", dt.datetime.now(UTC)
    xid_jobs(conn, cluster, "gpu-a1", 0, ["alice"], now)
    xid_jobs(conn, cluster, "gpu-a2", 1, ["bob", "carol", "dave"], now)
    found = {g.gpu: g for g in suspect_gpus(conn, now - dt.timedelta(days=7), now, cluster)}
    one, three = found["gpu-a1/0"], found["gpu-a2/1"]
    assert one.drain_line() is not None  # a plain host name: a line could be written...
    assert one.worth_watching(3) and one.drain_suggestion(3) is None  # ...and is not suggested for one job
    assert one.as_json(3)["drain"] is None and one.as_json(3)["worth_watching"] is True
    assert not three.worth_watching(3) and three.drain_suggestion(3) == three.drain_line()
    assert three.as_json(3)["user_count"] == 3 and three.as_json(3)["drain"] == (
        "scontrol update NodeName=gpu-a2 State=DRAIN Reason='jobsight: GPU 1 hurt 3 jobs "
        "(Xid 79 (GPU fell off the bus) ×3)'")
    # The site's count decides; 0 (alerts off) suggests no drain at all.
    assert one.drain_suggestion(1) == one.drain_line()
    assert three.drain_suggestion(4) is None and three.drain_suggestion(0) is None


def test_the_api_suggests_a_drain_only_at_the_sites_count(client: Any, conn: psycopg.Connection[Any]) -> None:
    cluster, now = f"drain-{uuid.uuid4().hex[:8]}", dt.datetime.now(UTC)
    xid_jobs(conn, cluster, "gpu-b1", 0, ["alice"], now)
    xid_jobs(conn, cluster, "gpu-b2", 2, ["bob", "carol", "dave"], now)
    answer = client.get("/v1/suspect-gpus", params={"cluster": cluster})
    assert answer.status_code == 200, answer.text
    rows = {row["gpu"]: row for row in answer.json()["gpus"]}
    assert (rows["gpu-b1/0"]["drain"], rows["gpu-b1/0"]["worth_watching"]) == (None, True)
    assert rows["gpu-b2/2"]["drain"].startswith("scontrol update NodeName=gpu-b2 State=DRAIN ")
    assert rows["gpu-b2/2"]["drain_min_jobs"] == 3 and rows["gpu-b2/2"]["worth_watching"] is False


def test_the_alert_carries_the_drain_line_only_over_the_count(conn: psycopg.Connection[Any]) -> None:
    cluster, now = f"drain-{uuid.uuid4().hex[:8]}", dt.datetime.now(UTC)
    xid_jobs(conn, cluster, "gpu-c1", 0, ["alice"], now)
    xid_jobs(conn, cluster, "gpu-c2", 3, ["bob", "carol", "dave"], now)
    health = load_health_settings(suspect_alert_jobs=3)
    alerts = load_alert_settings(sinks=[{"name": "ops", "url": "json://localhost:9/hook"}])
    alert_suspects(conn, health, alerts, now.timestamp())
    rows = conn.execute("SELECT title, lines FROM notices WHERE kind = 'suspect' AND cluster = %s",
                        (cluster,)).fetchall()
    assert [row["title"] for row in rows] == ["jobsight: suspect GPU gpu-c2?3"]  # one job: no alert at all
    text = str(rows[0]["lines"])
    assert "hurt 3 jobs of 3 users" in text and "scontrol update NodeName=gpu-c2 State=DRAIN" in text
