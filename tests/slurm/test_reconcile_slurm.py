"""Reconciliation against a real Slurm: jobs whose epilog posted nothing to this collector end as
Slurm says, read from ``sacct`` where accounting answers, else from ``squeue --json``.

Each job really runs on the test cluster; its hooks post wherever ``/etc/jobsight/hooks.env``
points, never to this test's collector (a port of its own, on a database of its own). The test
posts only the job's ``job_started``, as the prolog would have, after the job ended in Slurm: the
epilog's ``job_ended`` never arrives, so only the reconciliation pass (every 0.5 s here, the lost
rule held off by an hour of grace) can end the job.

Needs root and the Slurm binaries; starts the test cluster when it is not up. Skips otherwise, or
fails with ``JOBSIGHT_REQUIRE_SLURM=1`` (CI).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.protocol.wire import encode_batch
from tests.conftest import REPO, LiveCollector, create_database
from tests.slurm import slurm_commands
from tests.slurm.slurm_commands import SACCT, SBATCH, SCANCEL, SCONTROL, SLURMCTLD, SLURMD, SQUEUE

pytestmark = pytest.mark.slurm

SETUP = REPO / "tests" / "slurm" / "setup_cluster.sh"
SLURM_BINARIES = (SBATCH, SCANCEL, SCONTROL, SLURMCTLD, SLURMD)
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "PREEMPTED")
JOB_TIMEOUT_S = 120.0
RECONCILE_TIMEOUT_S = 60.0


def _unavailable(reason: str) -> None:
    if os.environ.get("JOBSIGHT_REQUIRE_SLURM") == "1":
        pytest.fail(f"JOBSIGHT_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def scontrol_job(job: str) -> dict[str, str]:
    """The job's fields as ``scontrol`` prints them, times as epoch seconds."""
    out = subprocess.run([SCONTROL, "--oneliner", "show", "job", job], capture_output=True, text=True,
                         timeout=10, env={"PATH": "/usr/bin:/bin", "SLURM_TIME_FORMAT": "%s"}).stdout
    return dict(re.findall(r"(?:^|\s)([A-Za-z]+)=(\S*)", out))


def wait_for_state(job: str, wanted: tuple[str, ...]) -> dict[str, str]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = scontrol_job(job)
        if fields.get("JobState") in wanted:
            return fields
        time.sleep(0.3)
    raise AssertionError(f"job {job} not {'/'.join(wanted)} after {JOB_TIMEOUT_S:.0f} s: {fields}")


def submit(*wrap: str) -> str:
    result = subprocess.run(
        [SBATCH, "--parsable", "-t", "5", "-J", "reconcile-test", "-o", "/dev/null", "-D", "/tmp",
         "--wrap", " ".join(wrap)],
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def slurm() -> None:
    """The test cluster, up (started by tests/slurm/setup_cluster.sh when it is not)."""
    missing = (["root"] if os.geteuid() != 0 else []) + [b for b in SLURM_BINARIES if not os.access(b, os.X_OK)]
    if missing:
        _unavailable("reconciliation against Slurm needs " + ", ".join(missing)
                     + "; run `bash tests/slurm/setup_cluster.sh` as root first")
    ping = subprocess.run([SCONTROL, "ping"], capture_output=True, text=True, timeout=30)
    if "UP" not in ping.stdout:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "JOBSIGHT_BIN": str(Path(sys.executable).parent / "jobsight"),
               **slurm_commands.setup_environment()}
        result = subprocess.run(["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            _unavailable(f"tests/slurm/setup_cluster.sh failed: {(result.stderr or result.stdout).strip()[-1500:]}")


@pytest.fixture(scope="module")
def reconciling(slurm: None, postgres: EmbeddedPostgres, data_dir: Path, admin_token: str,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveCollector]:
    """A collector on a database of its own, reconciling every 0.5 s with the real sacct and squeue."""
    url = create_database(postgres, f"rs_{uuid.uuid4().hex[:12]}")
    migrate.upgrade(url)
    env = {"JOBSIGHT_RECONCILE_INTERVAL_S": "0.5", "JOBSIGHT_RECONCILE_GRACE_S": "3600",
           "JOBSIGHT_RECONCILE_SACCT": SACCT, "JOBSIGHT_RECONCILE_SQUEUE": SQUEUE}
    collector = LiveCollector(url, data_dir, admin_token, tmp_path_factory.mktemp("reconcile") / "collector.log",
                              env=env)
    collector.start()
    yield collector
    collector.kill()


def post_started(collector: LiveCollector, job: str, fields: dict[str, str]) -> None:
    """What the prolog would have posted, and nothing more."""
    host = socket.gethostname().split(".")[0]
    record = {"kind": "job_started", "job": job, "ts": int(fields["StartTime"]) * 1_000_000, "node": host,
              "user": "root", "uid": 0, "partition": "gpu", "name": "reconcile-test", "nodes": [host],
              "node_count": 1, "time_limit_s": 300}
    request = urllib.request.Request(
        f"{collector.url}/v1/ingest", data=encode_batch(f"reconcile-{uuid.uuid4().hex}", 1, [record]),
        headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {collector.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def reconciled(collector: LiveCollector, job: str) -> dict[str, Any]:
    """The job's row once it is no longer running."""
    with psycopg.connect(collector.database_url, autocommit=True, row_factory=dict_row) as conn:
        deadline = time.monotonic() + RECONCILE_TIMEOUT_S
        while True:
            row = conn.execute("SELECT j.*, s.gpu_count FROM jobs j LEFT JOIN job_summaries s USING (cluster, job_id) "
                               "WHERE j.job_id = %s", (job,)).fetchone()
            assert row is not None
            if row["state"] != "running" or time.monotonic() > deadline:
                return dict(row)
            time.sleep(0.3)


def sacct_answers() -> bool:
    return subprocess.run([SACCT, "-n", "-X", "-j", "1"], capture_output=True, timeout=30).returncode == 0


def check_reconciled(collector: LiveCollector, job: str, fields: dict[str, str], state: str, code: int) -> None:
    row = reconciled(collector, job)
    log = collector.log_path.read_text()[-3000:]
    assert (row["state"], row["exit_code"]) == (state, code), f"{row}\n{log}"
    assert row["end_time"] == dt.datetime.fromtimestamp(int(fields["EndTime"]), dt.UTC)
    assert row["attrs"]["end_source"] == ("sacct" if sacct_answers() else "squeue")
    assert fields["JobState"] in row["attrs"]["end_reason"]
    assert row["gpu_count"] is not None, "the summary is computed when the job is reconciled"


def test_a_failed_job_whose_epilog_posted_nothing_ends_failed_with_its_exit_code(
    reconciling: LiveCollector,
) -> None:
    job = submit("exit 3")
    fields = wait_for_state(job, FINAL)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "3:0")
    post_started(reconciling, job, fields)
    check_reconciled(reconciling, job, fields, "failed", 3)


def test_a_cancelled_job_whose_epilog_posted_nothing_ends_cancelled(reconciling: LiveCollector) -> None:
    job = submit("sleep 120")
    wait_for_state(job, ("RUNNING",))
    subprocess.run([SCANCEL, job], check=True, timeout=30)
    fields = wait_for_state(job, FINAL)
    assert fields["JobState"] == "CANCELLED"
    post_started(reconciling, job, fields)
    code, signal = (int(part) for part in fields["ExitCode"].split(":"))
    # Slurm's "0:15" (killed by SIGTERM) reads as 143, as the epilog reads SLURM_JOB_EXIT_CODE2.
    check_reconciled(reconciling, job, fields, "cancelled", 128 + signal if signal else code)
