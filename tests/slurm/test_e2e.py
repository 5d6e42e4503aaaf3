"""The real-Slurm end-to-end: slurmctld + slurmd with jobsight's prolog, epilog and task
prolog, four fake GPUs, the node daemon on the fake NVML, a collector on the embedded
PostgreSQL, and real ``sbatch --gres=gpu:2`` jobs training a tiny Lightning model.

Needs root and a running test cluster (``bash tests/slurm/setup_cluster.sh``). Without
them the tests skip and say what is missing; with ``JOBSIGHT_REQUIRE_SLURM=1`` (CI)
that is a failure instead.

Wiring (all under :data:`E2E_DIR`, made afresh for each run):

* ``/etc/jobsight/hooks.env`` is rewritten through ``setup_cluster.sh`` with
  ``JOBSIGHT_URL`` (this collector), ``JOBSIGHT_SECRET_FILE``, ``JOBSIGHT_SPOOL_DIR``,
  ``JOBSIGHT_HOOK_LOG`` and ``JOBSIGHT_NODE``; it is put back (``JOBSIGHT_BIN`` only)
  at the end. Registrations and tokens use the production defaults
  (``/run/jobsight/jobs``, ``/run/jobsight/tokens``) because the training process
  looks for its registration there.
* The node daemon gets the same secret, spool and node name plus the fake NVML
  (``JOBSIGHT_NVML_LIBRARY``, ``FAKE_NVML_SCENARIO`` = ``four_gpus.json``).
* Jobs are submitted with a clean environment: no ``JOBSIGHT_URL``/``_TOKEN``/``_JOB_ID``,
  so whatever jobsight variables a job has came from the task prolog. Their spool is
  the daemon's, so the daemon replays what a job could not send.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.protocol.tokens import verify_token
from jobsight.protocol.wire import encode_batch, now_us
from tests.conftest import REPO, LiveCollector
from tests.slurm import slurm_commands
from tests.slurm.slurm_commands import SBATCH, SCONTROL, SLURMCTLD, SLURMD, SQUEUE

pytestmark = pytest.mark.slurm

E2E_DIR = Path("/var/tmp/jobsight-e2e")
SETUP = REPO / "tests" / "slurm" / "setup_cluster.sh"
TRAIN = REPO / "tests" / "slurm" / "e2e_train.py"
REGISTRATIONS = Path("/run/jobsight/jobs")
SLURM_BINARIES = (SBATCH, SCONTROL, SQUEUE, SLURMCTLD, SLURMD)
JOB_TIMEOUT_S = 150.0
DATA_TIMEOUT_S = 45.0
REPLAY_TIMEOUT_S = 120.0
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")


def _unavailable(reason: str) -> None:
    if os.environ.get("JOBSIGHT_REQUIRE_SLURM") == "1":
        pytest.fail(f"JOBSIGHT_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _check_machine() -> None:
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the hooks, /etc/jobsight and the Slurm daemons)")
    missing += [b for b in SLURM_BINARIES if not os.access(b, os.X_OK)]
    if missing:
        _unavailable("the real-Slurm end-to-end needs " + ", ".join(missing)
                     + "; run `bash tests/slurm/setup_cluster.sh` as root first")
    for module in ("torch", "lightning"):
        try:
            __import__(module)
        except ImportError:
            _unavailable(f"the end-to-end job needs {module} (pip install -e '.[all]')")


def _jobsight_bin() -> str:
    candidate = Path(sys.executable).parent / "jobsight"
    if not os.access(candidate, os.X_OK):
        _unavailable(f"{candidate} not found: the hooks need the venv's jobsight executable")
    return str(candidate)


def _setup_cluster(extra: dict[str, str]) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "JOBSIGHT_BIN": _jobsight_bin(),
           **slurm_commands.setup_environment(), **extra}
    result = subprocess.run(["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        _unavailable(f"tests/slurm/setup_cluster.sh failed: {(result.stderr or result.stdout).strip()[-1500:]}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_state(job: str) -> tuple[str, str]:
    """``(JobState, ExitCode)`` as Slurm's structured answer gives them (never parsed out of a line
    that holds the job's name: the hostile tests name jobs ``JobState=NODE_FAIL ...``), ended jobs
    included on every Slurm version (:func:`tests.slurm.slurm_commands.job_state`)."""
    return slurm_commands.job_state(job if "_" not in job else _array_task_id(job))


def _array_task_id(task: str) -> str:
    """Slurm's own id of array task ``N_i`` (squeue -j N_i answers it)."""
    out = subprocess.run([SQUEUE, "-h", "-t", "all", "-j", task, "-o", "%A"], capture_output=True,
                         text=True, timeout=10).stdout.split()
    return out[0] if out else task


@dataclass
class Cluster:
    collector: LiveCollector
    secret: str
    host: str
    database_url: str
    admin_token: str
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)
    """Job id -> what its script printed (``KEY=value`` lines)."""

    def start_collector(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("JOBSIGHT_SECRET_FILE", str(E2E_DIR / "cluster_secret"))
            self.collector.start()

    def submit(self, name: str, steps: int = 40) -> str:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(E2E_DIR / "home"), "LANG": "C.UTF-8",
               "JOBSIGHT_SPOOL_DIR": str(E2E_DIR / "spool"), "E2E_STEPS": str(steps)}
        result = subprocess.run(
            [SBATCH, "--parsable", "--gres=gpu:2", "-J", name, "-t", "10",
             "-o", str(E2E_DIR / "out" / "%j.out"), "-D", str(E2E_DIR / "work"),
             "--wrap", f"exec {sys.executable} {TRAIN}"],
            env=env, capture_output=True, text=True, timeout=30,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip().split(";")[0]

    def wait(self, *jobs: str) -> dict[str, tuple[str, str]]:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        states: dict[str, tuple[str, str]] = {}
        while time.monotonic() < deadline:
            states = {job: job_state(job) for job in jobs}
            if all(s.split("+")[0] in FINAL_STATES for s, _ in states.values()):
                for job in jobs:
                    self.jobs[job] = self.output(job)
                return states
            time.sleep(0.5)
        raise AssertionError(f"jobs not finished after {JOB_TIMEOUT_S:.0f} s: {states}")

    def output(self, job: str) -> dict[str, str]:
        text = (E2E_DIR / "out" / f"{job}.out").read_text(errors="replace")
        return dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Z_]+=", line))

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def scalar(self, sql: str, *params: Any) -> Any:
        return self.query(sql, *params)[0][0]

    def wait_for(self, what: str, check: Any, timeout: float = DATA_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not in the database after {timeout:.0f} s\n{self.diagnostics()}")
            time.sleep(0.5)

    def stored(self, job: str) -> bool:
        return bool(self.scalar(
            """SELECT (SELECT count(*) FROM steps WHERE job_id = %s) > 0
                  AND (SELECT count(*) FROM log_events WHERE job_id = %s AND message LIKE 'hello from e2e job%%') > 0
                  AND (SELECT count(*) FROM profiles WHERE job_id = %s) > 0
                  AND (SELECT count(*) FROM gpu_samples WHERE job_id = %s) > 0
                  AND (SELECT count(*) FROM job_summaries WHERE job_id = %s) > 0""",
            job, job, job, job, job))

    def diagnostics(self) -> str:
        parts = []
        for path in (E2E_DIR / "hooks.log", E2E_DIR / "daemon.log", self.collector.log_path,
                     *sorted((E2E_DIR / "out").glob("*.out"))):
            try:
                parts.append(f"--- {path} (tail)\n" + path.read_text(errors="replace")[-3000:])
            except OSError:
                pass
        return "\n".join(parts)


@pytest.fixture(scope="module")
def cluster(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Cluster]:
    _check_machine()
    try:
        from tests.fake_nvml.build import SCENARIOS, GccMissing, build_fake_nvml

        library = build_fake_nvml()
    except GccMissing as exc:
        _unavailable(str(exc))
    if queue := slurm_commands.busy_queue():
        _unavailable(f"other jobs are in the Slurm queue; the end-to-end needs the test cluster to itself:\n{queue}")

    shutil.rmtree(E2E_DIR, ignore_errors=True)
    for sub in ("spool", "out", "work", "home", "daemon"):
        (E2E_DIR / sub).mkdir(parents=True, mode=0o755)
    E2E_DIR.chmod(0o755)
    secret = uuid.uuid4().hex + uuid.uuid4().hex
    secret_file = E2E_DIR / "cluster_secret"
    secret_file.write_text(secret + "\n")
    secret_file.chmod(0o600)
    # Registrations left by an earlier, interrupted run would claim the fake GPUs.
    for stale in REGISTRATIONS.glob("*.json"):
        stale.unlink()
    host = socket.gethostname().split(".")[0]

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    shared = {"JOBSIGHT_URL": url, "JOBSIGHT_SECRET_FILE": str(secret_file),
              "JOBSIGHT_SPOOL_DIR": str(E2E_DIR / "spool"), "JOBSIGHT_NODE": host}
    _setup_cluster({**shared, "JOBSIGHT_HOOK_LOG": str(E2E_DIR / "hooks.log")})

    # Late samples of an ended job reach its summary through the refresh pass: every 2 s here, not 60.
    collector = LiveCollector(database_url, data_dir, admin_token, E2E_DIR / "collector.log",
                              env={"JOBSIGHT_SUMMARY_REFRESH_INTERVAL_S": "2"})
    collector.port, collector.url = port, url
    state = Cluster(collector, secret, host, database_url, admin_token)
    daemon: subprocess.Popen[bytes] | None = None
    daemon_log = open(E2E_DIR / "daemon.log", "ab")
    try:
        state.start_collector()
        daemon_env = {**os.environ, **shared, "JOBSIGHT_DATA_DIR": str(E2E_DIR / "daemon"),
                      "JOBSIGHT_NVML_LIBRARY": str(library), "FAKE_NVML_SCENARIO": str(SCENARIOS / "four_gpus.json")}
        for name in ("JOBSIGHT_TOKEN", "JOBSIGHT_TOKEN_FILE", "JOBSIGHT_JOB_ID", "JOBSIGHT_REGISTRATION_DIR"):
            daemon_env.pop(name, None)
        daemon = subprocess.Popen([sys.executable, "-m", "jobsight", "agent", "--interval", "0.5"], env=daemon_env,
                                  cwd=REPO, stdout=daemon_log, stderr=subprocess.STDOUT)
        yield state
    finally:
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
        daemon_log.close()
        collector.kill()
        _setup_cluster({})  # hooks.env back to JOBSIGHT_BIN only


@pytest.fixture(scope="module")
def two_jobs(cluster: Cluster) -> tuple[str, str]:
    """Two concurrent ``sbatch --gres=gpu:2`` jobs, finished, with their records stored."""
    first, second = cluster.submit("e2e-a"), cluster.submit("e2e-b")
    states = cluster.wait(first, second)
    assert all(s == ("COMPLETED", "0:0") for s in states.values()), f"{states}\n{cluster.diagnostics()}"
    for job in (first, second):
        cluster.wait_for(f"job {job}'s records", lambda job=job: cluster.stored(job))
    return first, second


def test_each_job_is_stored_under_its_own_id_with_its_own_gpus(cluster: Cluster, two_jobs: tuple[str, str]) -> None:
    gpus_seen = {}
    for job in two_jobs:
        printed = cluster.jobs[job]
        allocated = {int(g) for g in printed["SLURM_JOB_GPUS"].split(",")}
        assert len(allocated) == 2
        sampled = {r[0] for r in cluster.query("SELECT DISTINCT gpu_index FROM gpu_samples WHERE job_id = %s", job)}
        assert sampled == allocated, f"job {job}: samples of GPUs {sampled}, allocated {allocated}"
        assert {r[0] for r in cluster.query("SELECT DISTINCT node FROM gpu_samples WHERE job_id = %s", job)} == {
            cluster.host}
        gpus_seen[job] = allocated
        row = cluster.query("SELECT state, exit_code, user_name, partition, nodes, gpus, name FROM jobs "
                            "WHERE job_id = %s", job)[0]
        assert row[:5] == ("completed", 0, "root", "gpu", [cluster.host])
        assert row[5] == [f"{cluster.host}:{g}" for g in sorted(allocated)]
        assert row[6] in ("e2e-a", "e2e-b")
        for table in ("steps", "log_events", "profiles", "metrics"):
            assert cluster.scalar(f"SELECT count(*) FROM {table} WHERE job_id = %s", job) > 0, (job, table)
    first, second = two_jobs
    assert not gpus_seen[first] & gpus_seen[second], "concurrent jobs must have disjoint GPUs"


def test_each_job_used_the_token_from_its_task_prolog(cluster: Cluster, two_jobs: tuple[str, str]) -> None:
    for job in two_jobs:
        printed = cluster.jobs[job]
        assert printed["JOBSIGHT_JOB_ID"] == job and printed["JOBSIGHT_URL"] == cluster.collector.url
        # The submit environment had no token: this one was minted by the prolog for this job.
        claims = verify_token(cluster.secret, printed["JOBSIGHT_TOKEN"])
        assert (claims.kind, claims.job) == ("job", job)
        # -t 10: ten minutes plus the hour of grace.
        assert 3600 + 600 - 120 < claims.expires_at - claims.issued_at <= 3600 + 600
    hooks_log = (E2E_DIR / "hooks.log")
    text = hooks_log.read_text() if hooks_log.exists() else ""
    assert "Traceback" not in text, text[-3000:]


def test_a_job_token_cannot_write_into_the_other_job(cluster: Cluster, two_jobs: tuple[str, str]) -> None:
    first, second = two_jobs
    token = cluster.jobs[first]["JOBSIGHT_TOKEN"]
    record = {"kind": "log", "job": second, "ts": now_us(), "level": "INFO", "message": "intruder"}
    request = urllib.request.Request(
        f"{cluster.collector.url}/v1/ingest", data=encode_batch(f"e2e-intruder-{uuid.uuid4()}", 1, [record]),
        headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {token}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert f"cannot write records of job {second}" in refused.value.read().decode()
    assert cluster.scalar("SELECT count(*) FROM log_events WHERE job_id = %s AND message = 'intruder'", second) == 0


SUMMARY_COUNTS_GPUS = ("SELECT jsonb_array_length(summary -> 'gpus') = %s AND NOT summary ? 'refresh_due' "
                       "FROM job_summaries WHERE job_id = %s")
"""Whether a job's summary lists this many GPUs and counts every row stored (no refresh pending)."""


def test_both_jobs_have_summaries_and_reports(cluster: Cluster, two_jobs: tuple[str, str]) -> None:
    for job in two_jobs:
        allocated = sorted(int(g) for g in cluster.jobs[job]["SLURM_JOB_GPUS"].split(","))
        # The node daemon's last samples may come after the epilog's summary: the refresh pass counts them.
        gpus = len(allocated)
        cluster.wait_for(f"job {job}'s summary with its GPUs",
                         lambda job=job, gpus=gpus: bool(cluster.scalar(SUMMARY_COUNTS_GPUS, gpus, job)))
        count, flags, summary = cluster.query(
            "SELECT gpu_count, flags, summary FROM job_summaries WHERE job_id = %s", job)[0]
        assert count == 2 and isinstance(flags, list)
        assert [g["gpu_index"] for g in summary["gpus"]] == allocated
        assert summary["steps"]["count"] > 0 and summary["steps"]["steps_per_s"] > 0
        assert all(g["energy_kwh"] is not None for g in summary["gpus"])
        env = {**os.environ, "JOBSIGHT_URL": cluster.collector.url, "JOBSIGHT_TOKEN": cluster.admin_token}
        report = subprocess.run([sys.executable, "-m", "jobsight", "report", job], env=env, cwd=REPO,
                                capture_output=True, text=True, timeout=30)
        assert report.returncode == 0, report.stderr
        assert f"Job ID: {job}" in report.stdout and "State: COMPLETED\n" in report.stdout  # exit code 0 adds nothing
        for index in allocated:
            assert f"{cluster.host} (GPU {index})" in report.stdout
        print(report.stdout)


def test_with_the_collector_stopped_a_job_runs_and_its_records_arrive_later(
    cluster: Cluster, two_jobs: tuple[str, str]
) -> None:
    cluster.collector.stop()
    try:
        started = time.monotonic()
        job = cluster.submit("e2e-outage", steps=20)
        states = cluster.wait(job)
        assert states[job] == ("COMPLETED", "0:0"), f"{states}\n{cluster.diagnostics()}"
        took = time.monotonic() - started
        assert cluster.jobs[job]["JOBSIGHT_JOB_ID"] == job
        assert "E2E_DONE" in (E2E_DIR / "out" / f"{job}.out").read_text()
        assert "unavailable" in (E2E_DIR / "hooks.log").read_text()
    finally:
        cluster.start_collector()
    # The prolog's and epilog's records, the job's own and the daemon's samples were spooled;
    # the node daemon replays them now that the collector is back.
    cluster.wait_for(f"job {job}'s records after the outage", lambda: cluster.stored(job), timeout=REPLAY_TIMEOUT_S)
    row = cluster.query("SELECT state, exit_code, nodes FROM jobs WHERE job_id = %s", job)[0]
    assert row == ("completed", 0, [cluster.host])
    print(f"outage job {job} ran in {took:.1f} s with the collector stopped")
