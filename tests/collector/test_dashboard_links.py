"""The dashboard links the collector hands out, under its public URL setting (``dashboard_url``):
in alert messages (a finding's moment on its job's page) and in the summary answer, from which
``jobsight report`` prints the job's page, each finding's moment and the audit of the job's days."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobsight.collector.passes.alert_messages import compose
from jobsight.collector.passes.alerts import AlertSender, enqueue
from jobsight.protocol.wire import now_us
from jobsight.rules import links
from jobsight.rules.report_text import format_report
from tests.collector.helpers import gz, post
from tests.collector.test_alerts import (  # noqa: F401 (receiver: the fixture)
    Receiver,
    add_job,
    open_finding,
    receiver,
    settings_with,
    sink_name,
)

UTC = dt.UTC
PUBLIC = "https://hpc.example/jobsight/"
"""The dashboard's public URL (a path under a site's proxy, with the trailing slash people write)."""
S = 1_000_000


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


@pytest.fixture
def public_client(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Any]:
    """The collector in-process, its dashboard published at :data:`PUBLIC`."""
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    settings = load_collector_settings(database_url=database_url, data_dir=data_dir, dashboard_url=PUBLIC)
    with TestClient(create_app(settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {admin_token}"
        yield test_client


def test_each_alert_line_links_its_findings_moment() -> None:
    last_step = dt.datetime(2024, 3, 4, 10, 0, 7, tzinfo=UTC)
    opened = dt.datetime(2024, 3, 4, 10, 8, 0, tzinfo=UTC)
    rows = [
        {"event": "opened", "job_id": "101", "cluster": "prod", "user_name": "alice", "finding_id": 1,
         "rule": "hung_rank", "subject": "rank 1", "severity": "critical", "title": "Rank 1 has stopped stepping",
         "message": "no step for 8 min", "opened_at": opened, "at_ts": last_step},
        {"event": "resolved", "job_id": "102", "cluster": "prod", "user_name": "bob", "finding_id": 2,
         "rule": "straggler", "subject": "rank 0", "severity": "warning", "title": "Rank 0 is a straggler",
         "message": "", "opened_at": opened, "resolved_at": opened + dt.timedelta(minutes=5)},
    ]
    _, body, _ = compose(rows, PUBLIC)
    hung, slow = body.splitlines()
    assert hung.endswith(" https://hpc.example/jobsight/job?cluster=prod&job=101&t=2024-03-04T10:00:07Z")
    assert slow.endswith(" https://hpc.example/jobsight/job?cluster=prod&job=102&t=2024-03-04T10:08:00Z")  # no at_ts
    _, bare, _ = compose(rows, None)
    assert "http" not in bare  # no public URL set: no links


def test_a_sent_alert_links_the_job_page_at_the_findings_moment(
    db: psycopg.Connection[Any], job_id: str, receiver: Receiver  # noqa: F811 (the fixture)
) -> None:
    job = add_job(db, job_id)
    settings = settings_with({"name": sink_name(), "url": receiver.url()})
    with db.transaction():
        finding = open_finding(db, job_id)
        # The hung rank's last step, before the finding opened: the moment the link points at.
        [at_ts] = db.execute("""UPDATE findings SET at_ts = opened_at - interval '5 minutes'
                                WHERE job_id = %s AND id = %s RETURNING at_ts""", (job_id, finding["id"])).fetchone()
        assert enqueue(db, settings, finding, "opened", job) == 1
    assert AlertSender(db, settings, dashboard_url=PUBLIC).send_due() == 1
    message = receiver.posts[0][1]["message"]
    link = message.split()[-1]
    assert link.startswith("https://hpc.example/jobsight/job?")
    query = _query(link)
    assert query["cluster"] == ["default"] and query["job"] == [job_id]
    assert links.parse_moment(query["t"][0]) == at_ts.replace(microsecond=0)


def test_report_prints_the_job_page_each_findings_moment_and_the_audit_of_its_days(
    public_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    t0 = now_us() - 3 * 86400 * S  # three days ago, ended a day later: the audit covers two days
    records = [{"kind": "job_started", "job": job_id, "ts": t0, "node": "n1", "user": "alice", "gpus": ["0"]},
               {"kind": "gpu_sample", "job": job_id, "ts": t0 + S, "node": "n1", "gpu_index": 0,
                "gpu_uuid": "GPU-0", "util_gpu": 3.0},
               {"kind": "job_ended", "job": job_id, "ts": t0 + 86400 * S, "node": "n1", "exit_code": 0}]
    assert post(public_client, gz(records)).status_code == 200
    start = dt.datetime.fromtimestamp(t0 / S, UTC)
    last_step = (start + dt.timedelta(hours=2)).replace(microsecond=0)
    db.execute(
        """INSERT INTO findings (cluster, job_id, rule, subject, rank, severity, state, opened_at, updated_at,
                                 resolved_at, at_ts, title, message, evidence)
           VALUES ('default', %s, 'hung_rank', 'rank 1', 1, 'critical', 'resolved', %s, %s, %s, %s,
                   'Rank 1 has stopped stepping', 'no step for 8 min', %s)""",
        (job_id, last_step + dt.timedelta(minutes=8), last_step, last_step + dt.timedelta(hours=1), last_step,
         Jsonb({})))

    answer = public_client.get(f"/v1/jobs/{job_id}/summary").json()
    assert answer["dashboard_base_url"] == PUBLIC
    assert answer["dashboard_url"] == f"https://hpc.example/jobsight/job?cluster=default&job={job_id}"
    answer["findings"] = public_client.get(f"/v1/jobs/{job_id}/findings").json()["findings"]
    text = format_report(public_client.get(f"/v1/jobs/{job_id}").json(), answer)

    assert f"Dashboard: {answer['dashboard_url']}" in text
    moment = next(line.strip() for line in text.splitlines() if "&t=" in line)
    assert moment == links.job_link("default", job_id, last_step, base=PUBLIC)  # at_ts, not when it opened
    audit = next(line.split()[-1] for line in text.splitlines() if "Audit of the days it ran" in line)
    end = start + dt.timedelta(days=1)
    assert _query(audit) == {"from": [start.date().isoformat()], "to": [end.date().isoformat()]}
    assert audit.startswith("https://hpc.example/jobsight/audit?")
