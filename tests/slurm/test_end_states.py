"""Acceptance on a real Slurm: jobs that end as Slurm says they ended (``scancel`` → cancelled,
``-t 1`` → timeout, ``exit 3`` → failed 3, over ``--mem`` → out_of_memory where Slurm enforces memory)
are stored with that state, through the real prolog and epilog.

Needs root and the test cluster (``bash tests/slurm/setup_cluster.sh``); skips otherwise, and fails
instead with ``JOBSIGHT_REQUIRE_SLURM=1`` (CI). All jobs are submitted at once (the cluster runs four at
a time), so the module costs about the time limit job's 60–90 s. The hooks reach this module's own
collector through ``/etc/jobsight/hooks.env``, put back to ``JOBSIGHT_BIN`` only at the end, like
tests/slurm/test_e2e.py: the Slurm modules must not run at the same time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import LiveCollector
from tests.dashboard.header_facts import header_facts
from tests.slurm.job_page import open_job_page
from tests.slurm.slurm_commands import SBATCH, SCANCEL, SCONTROL
from tests.slurm.test_e2e import FINAL_STATES, SLURM_BINARIES, _free_port, _setup_cluster, _unavailable, job_state

pytestmark = pytest.mark.slurm

WORK = Path("/var/tmp/jobsight-ends")
START_TIMEOUT_S = 60.0
END_TIMEOUT_S = 180.0  # the -t 1 job: a minute, then slurmctld's time limit check (every 30 s) and KillWait
STORE_TIMEOUT_S = 30.0
CANCEL_AFTER_S = 10.0
OOM_MEM = "64M"


def _memory_enforced() -> str | None:
    """``None`` when Slurm on this cluster kills a job over its ``--mem``; else why it cannot."""
    config = subprocess.run([SCONTROL, "show", "config"], capture_output=True, text=True,
                            timeout=10).stdout
    node = subprocess.run([SCONTROL, "show", "node", "-o"], capture_output=True, text=True,
                          timeout=10).stdout
    task = re.search(r"^TaskPlugin\s*=\s*(\S+)", config, re.M)
    constrained = re.search(r"^ConstrainRAMSpace\s*=\s*yes", config, re.M | re.I)
    memory = re.search(r"\bRealMemory=(\d+)", node)
    # Only the cgroup's OOM killer makes Slurm say OUT_OF_MEMORY: jobacct_gather's OverMemoryKill
    # kills the step too, but Slurm 22.05 names that FAILED (Reason=JobLaunchFailure, 0:9).
    if task and "task/cgroup" in task.group(1) and constrained and memory and int(memory.group(1)) > 512:
        return None
    return (f"Slurm cannot enforce --mem with a cgroup on this test cluster (tests/slurm/slurm.conf.in, "
            f"cgroup.conf.in): TaskPlugin={task.group(1) if task else '?'}, ConstrainRAMSpace "
            f"{'yes' if constrained else 'not yes'}, the node's RealMemory={memory.group(1) if memory else '?'} MB")


@dataclass
class Ends:
    collector: LiveCollector
    database_url: str
    jobs: dict[str, str]
    """What each job is for → its Slurm job id."""

    def row(self, job: str) -> tuple[Any, ...] | None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute("SELECT state, exit_code, end_time IS NOT NULL FROM jobs WHERE cluster = 'default' "
                                "AND job_id = %s", (job,)).fetchone()

    def wait_final(self, job: str) -> tuple[str, str]:
        deadline = time.monotonic() + END_TIMEOUT_S
        while time.monotonic() < deadline:
            state = job_state(job)
            if state[0].split("+")[0] in FINAL_STATES:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job} not finished after {END_TIMEOUT_S:.0f} s: {job_state(job)}\n{self.log()}")

    def stored(self, job: str) -> tuple[Any, ...]:
        """The job's (state, exit_code) once its epilog's record is in."""
        deadline = time.monotonic() + STORE_TIMEOUT_S
        while (row := self.row(job)) is None or not row[2]:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job}: no end stored after {STORE_TIMEOUT_S:.0f} s ({row})\n{self.log()}")
            time.sleep(0.3)
        return row[:2]

    def log(self) -> str:
        parts = []
        for path in (WORK / "hooks.log", self.collector.log_path):
            try:
                parts.append(f"--- {path} (tail)\n" + path.read_text(errors="replace")[-3000:])
            except OSError:
                pass
        return "\n".join(parts)


def _submit(name: str, *args: str) -> str:
    result = subprocess.run(
        [SBATCH, "--parsable", "-J", name, "-o", str(WORK / "out" / "%j.out"), "-D", str(WORK), *args],
        env={"PATH": "/usr/bin:/bin", "HOME": str(WORK), "LANG": "C.UTF-8"}, capture_output=True, text=True,
        timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def ends(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Ends]:
    if os.geteuid() != 0 or not all(os.access(b, os.X_OK) for b in SLURM_BINARIES):
        _unavailable("the end-state tests need root and Slurm; run `bash tests/slurm/setup_cluster.sh` as root")
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "out").mkdir(parents=True, mode=0o755)
    WORK.chmod(0o755)
    secret_file = WORK / "cluster_secret"
    secret_file.write_text(uuid.uuid4().hex * 2 + "\n")
    secret_file.chmod(0o600)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    _setup_cluster({"JOBSIGHT_URL": url, "JOBSIGHT_SECRET_FILE": str(secret_file),
                    "JOBSIGHT_SPOOL_DIR": str(WORK / "spool"), "JOBSIGHT_HOOK_LOG": str(WORK / "hooks.log")})
    collector = LiveCollector(database_url, data_dir, admin_token, WORK / "collector.log",
                              env={"JOBSIGHT_SECRET_FILE": str(secret_file)})
    collector.port, collector.url = port, url
    jobs: dict[str, str] = {}
    try:
        collector.start()
        jobs["cancel"] = _submit("ends-cancel", "-t", "5", "--wrap", "exec /bin/sleep 300")
        jobs["timeout"] = _submit("ends-timeout", "-t", "1", "--wrap", "exec /bin/sleep 300")
        jobs["exit3"] = _submit("ends-exit3", "-t", "5", "--wrap", "/bin/sleep 1; exit 3")
        if _memory_enforced() is None:
            jobs["oom"] = _submit("ends-oom", "-t", "5", f"--mem={OOM_MEM}", "--wrap",
                                  f"exec {sys.executable} -c 'b = bytearray(512 * 2**20); import time; time.sleep(30)'")
        yield Ends(collector, database_url, jobs)
    finally:
        for job in jobs.values():
            subprocess.run([SCANCEL, job], capture_output=True, timeout=10)
        collector.kill()
        _setup_cluster({})  # hooks.env back to JOBSIGHT_BIN only


def test_scancel_after_10_s_is_cancelled(ends: Ends) -> None:
    job = ends.jobs["cancel"]
    deadline = time.monotonic() + START_TIMEOUT_S
    while job_state(job)[0] != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} not running: {job_state(job)}\n{ends.log()}"
        time.sleep(0.3)
    time.sleep(CANCEL_AFTER_S)  # what the issue did: a job that ran a while, then scancel
    subprocess.run([SCANCEL, job], check=True, timeout=10)
    assert ends.wait_final(job)[0] == "CANCELLED"
    assert ends.stored(job) == ("cancelled", 128 + 15)


def test_a_job_killed_at_its_time_limit_is_timeout(ends: Ends) -> None:
    job = ends.jobs["timeout"]
    assert ends.wait_final(job)[0] == "TIMEOUT"
    assert ends.stored(job) == ("timeout", 128 + 15)


def test_exit_3_is_failed_with_3_and_the_job_page_says_so_as_slurm_does(
    ends: Ends, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = ends.jobs["exit3"]
    assert ends.wait_final(job) == ("FAILED", "3:0")
    assert ends.stored(job) == ("failed", 3)
    # The job page (an admin, through the dashboard's own sign-in path) reads the stored row.
    at = open_job_page(ends.database_url, job, monkeypatch)
    assert header_facts(at)["State"] == "FAILED (exit code 3)"


def test_a_job_over_its_mem_is_out_of_memory(ends: Ends) -> None:
    why = _memory_enforced()
    if why is not None:
        pytest.skip(why)
    job = ends.jobs["oom"]
    assert ends.wait_final(job)[0] == "OUT_OF_MEMORY"
    assert ends.stored(job)[0] == "out_of_memory"


def test_the_report_names_the_state_as_slurm_does(ends: Ends) -> None:
    job = ends.jobs["timeout"]
    ends.wait_final(job)
    ends.stored(job)
    env = {**os.environ, "JOBSIGHT_URL": ends.collector.url, "JOBSIGHT_TOKEN": ends.collector.token}
    report = subprocess.run([sys.executable, "-m", "jobsight", "report", job], env=env, capture_output=True,
                            text=True, timeout=30)
    assert report.returncode == 0, report.stderr
    assert "State: TIMEOUT (signal 15)" in report.stdout
    hooks_log = WORK / "hooks.log"
    assert "Traceback" not in (hooks_log.read_text() if hooks_log.exists() else "")
