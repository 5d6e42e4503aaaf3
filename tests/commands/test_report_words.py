"""``jobsight report`` says what a reader needs where it used to say nothing or the wrong thing: it never
ends "No efficiency problems found" under an open finding, it names the clusters that hold an id it
could not find in the one asked, and it names a run's user as the job's page does (the process's
owner outside Slurm, never "-"). Against a real collector (a uvicorn subprocess) on the real database,
with the real command, as a user runs it.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import urllib.request
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz
from tests.conftest import REPO, LiveCollector


def _post(collector: LiveCollector, records: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(f"{collector.url}/v1/ingest", data=gz(records, source=f"t-{uuid.uuid4().hex}"),
                                     headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {collector.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def _report(collector: LiveCollector, job: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JOBSIGHT_TOKEN": collector.token, "JOBSIGHT_URL": collector.url}
    env.pop("JOBSIGHT_CLUSTER", None)
    return subprocess.run([sys.executable, "-m", "jobsight", "report", job, *extra], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def _ended_job(collector: LiveCollector) -> str:
    """A job that ran a minute on one busy GPU with most of its memory: no efficiency flag."""
    job = f"w{uuid.uuid4().hex[:12]}"
    t0 = now_us() - 120_000_000
    _post(collector, [
        {"kind": "job_started", "job": job, "ts": t0, "node": "n1", "user": "alice", "nodes": ["n1"], "gpus": ["0"]},
        *({"kind": "gpu_sample", "job": job, "ts": t0 + s * 1_000_000, "node": "n1", "gpu_index": 0,
           "gpu_uuid": "GPU-0", "util_gpu": 90.0, "power_w": 300.0, "mem_used": 60 * 2**30, "mem_total": 80 * 2**30}
          for s in range(1, 50)),
        {"kind": "job_ended", "job": job, "ts": t0 + 60_000_000, "node": "n1", "state": "completed", "exit_code": 0},
    ])
    return job


def _cluster_of(db: psycopg.Connection[Any], job: str) -> str:
    row = db.execute("SELECT cluster FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row is not None
    return str(row[0])


def test_the_report_says_no_problems_only_when_no_finding_is_open(live_collector: LiveCollector,
                                                                   db: psycopg.Connection[Any]) -> None:
    job = _ended_job(live_collector)
    done = _report(live_collector, job)
    assert done.returncode == 0, done.stderr
    assert "No efficiency problems found." in done.stdout  # the same job, nothing open: all clear
    now = dt.datetime.now(dt.UTC)
    db.execute(
        """INSERT INTO findings (cluster, job_id, rule, severity, opened_at, updated_at, title, message, evidence)
           VALUES (%s, %s, 'hung_rank', 'critical', %s, %s, 'Job looks hung', 'rank 1 stopped', %s)""",
        (_cluster_of(db, job), job, now, now, Jsonb({})))
    done = _report(live_collector, job)
    assert done.returncode == 0, done.stderr
    assert "[critical] Job looks hung" in done.stdout
    assert "No efficiency problems found" not in done.stdout
    assert "No efficiency flags, but 1 finding(s) still open (critical): see Health above." in done.stdout


def test_a_job_of_another_cluster_is_named_with_its_cluster(live_collector: LiveCollector,
                                                            db: psycopg.Connection[Any]) -> None:
    job, far = f"x{uuid.uuid4().hex[:12]}", f"far-{uuid.uuid4().hex[:6]}"
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    db.execute(
        """INSERT INTO jobs (cluster, job_id, name, start_time, end_time, state, exit_code, attrs)
           VALUES (%s, %s, 'cpu-run', %s, %s, 'completed', 0, %s)""",
        (far, job, start, start + dt.timedelta(minutes=5), Jsonb({"process": {"user": "carol", "slurm": False}})))
    done = _report(live_collector, job)
    assert done.returncode == 1
    assert f"it is in cluster {far}: jobsight report {job} --cluster {far}" in done.stderr, done.stderr
    done = _report(live_collector, job, "--cluster", far)
    assert done.returncode == 0, done.stderr
    # Outside Slurm: the process's owner, as the job's page says, and no account to have.
    assert f"{'User/Account':>15}: carol/n/a" in done.stdout.splitlines()
    assert any(line.startswith(f"{'State':>15}: COMPLETED") for line in done.stdout.splitlines()), done.stdout
    assert f"{'Start Time':>15}: {start:%Y-%m-%d %H:%M:%S} UTC" in done.stdout.splitlines()


def test_an_id_no_cluster_holds_is_said_so(live_collector: LiveCollector) -> None:
    job = f"nobody-{uuid.uuid4().hex[:8]}"
    done = _report(live_collector, job)
    assert done.returncode == 1
    assert "no cluster of this collector has a job with this id" in done.stderr, done.stderr
