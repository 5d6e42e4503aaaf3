"""A process's environment names no job (issue #40), on the real Slurm of tests/slurm/, as an ordinary user.

Another user (root, here) runs two real batch jobs, the victim and the bystander, each keeping its one
GPU busy. Then the ordinary user :data:`~tests.slurm.test_hostile_jobs.USER`, outside Slurm, on the two
GPUs no job was given, starts two processes whose environment claims ``SLURM_JOB_ID=<the victim>`` and
``SLURM_JOB_ID=--user=root``; the fake NVML lists those pids on those idle GPUs. Before, the node daemon
took such a GPU's job from ``/proc/<pid>/environ``: the victim became "1 of 2 GPUs idle" and an
unfiltered cancel policy cancelled it, and the job ``--user=root`` reached ``scancel --user=root`` (every
job of the other user). Now the registration and the job's cgroup decide: the idle GPUs are uses outside any job, for
the admins (``gpu_unallocated_uses``), the victim keeps its telemetry, no finding opens and nothing is
cancelled, under a real (not dry-run) policy that acts on every partition.

Needs root and the test cluster (``bash tests/slurm/setup_cluster.sh``); skips otherwise, fails instead
with ``JOBSIGHT_REQUIRE_SLURM=1`` (CI).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.store import migrate
from tests.conftest import LiveCollector, create_database
from tests.slurm.slurm_commands import SBATCH, SCANCEL, SCONTROL, SQUEUE, busy_queue
from tests.slurm.test_e2e import FINAL_STATES, _free_port, _setup_cluster, _unavailable, job_state
from tests.slurm.test_hostile_jobs import USER, ordinary_user
from tests.slurm.test_waste_actions import BINARIES, DAEMON_BATCH_AGE_S, Daemon

pytestmark = pytest.mark.slurm

WORK = Path("/var/tmp/jobsight-neighbour")
REGISTRATIONS = Path("/run/jobsight/jobs")
IDLE_MIN_S, WARN_S, WARN_AGAIN_S, ACT_S = 8.0, 2.0, 4.0, 6.0
WATCH_S = IDLE_MIN_S + ACT_S + 10.0
"""How long the victim is watched with the hostile processes on the idle GPUs: past the idle window and
the whole ladder, with margin (findings and actions run every second)."""
POLICY = {"name": "idle-anywhere", "rule": "idle_allocation", "warn_after_s": WARN_S,
          "warn_again_after_s": WARN_AGAIN_S, "act_after_s": ACT_S, "action": "cancel", "dry_run": False}
COLLECTOR_ENV = {
    "JOBSIGHT_HEALTH_INTERVAL_S": "1", "JOBSIGHT_HEALTH_RULES": '["idle_allocation"]',
    "JOBSIGHT_HEALTH_IDLE_UTIL": "5", "JOBSIGHT_HEALTH_IDLE_MIN_S": str(IDLE_MIN_S),
    "JOBSIGHT_HEALTH_SAMPLE_STALE_S": "3600",
    "JOBSIGHT_ACTIONS_POLICIES": json.dumps([POLICY]), "JOBSIGHT_ACTIONS_INTERVAL_S": "1",
    "JOBSIGHT_ACTIONS_MAX_ACTIONS_PER_HOUR": "10", "JOBSIGHT_ACTIONS_STALE_AFTER_S": "5",
    "JOBSIGHT_ACTIONS_SCANCEL": SCANCEL, "JOBSIGHT_ACTIONS_SCONTROL": SCONTROL, "JOBSIGHT_ACTIONS_SQUEUE": SQUEUE,
}


@dataclass
class Neighbourhood:
    collector: LiveCollector
    database_url: str
    host: str
    uid: int
    jobs: dict[str, str] = field(default_factory=dict)
    """What each job is for → its Slurm id."""
    gpus: dict[str, list[int]] = field(default_factory=dict)
    """What each job is for → the GPUs its registration holds."""
    hostile: dict[str, int] = field(default_factory=dict)
    """The claimed job id → the pid of the process that claims it."""
    hostile_gpus: dict[str, int] = field(default_factory=dict)
    """The claimed job id → the GPU its process is on."""

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def state(self, what: str) -> str:
        return job_state(self.jobs[what])[0].split("+")[0]

    def diagnostics(self) -> str:
        parts = [f"jobs {self.jobs} gpus {self.gpus} hostile {self.hostile} on {self.hostile_gpus}"]
        for path in (WORK / "hooks.log", WORK / "daemon.log", self.collector.log_path):
            try:
                parts.append(f"--- {path} (tail)\n" + path.read_text(errors="replace")[-3000:])
            except OSError:
                pass
        return "\n".join(parts)


def _sbatch_as_root(what: str) -> str:
    """A job of the other user (root): the victim or the bystander."""
    result = subprocess.run(
        [SBATCH, "--parsable", "--gres=gpu:1", "-t", "5", "-J", f"neighbour-{what}", "-D", str(WORK),
         "-o", str(WORK / "%j.out"), "--wrap", "exec /bin/sleep 300"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(WORK), "LANG": "C.UTF-8"}, capture_output=True, text=True,
        timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def _registered_gpus(job: str, timeout: float = 60.0) -> list[int]:
    """The GPUs of the job's registration, once its prolog wrote it."""
    path = REGISTRATIONS / f"{job}.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"no registration of job {job} after {timeout:.0f} s")
        time.sleep(0.2)
    return [int(gpu) for gpu in json.loads(path.read_text())["gpus"]]


def _outside_slurm(claimed: str) -> subprocess.Popen[bytes]:
    """A process of :data:`USER`, started outside Slurm, whose environment claims job ``claimed``."""
    return subprocess.Popen(
        ["/usr/sbin/runuser", "-u", USER, "--", "/usr/bin/env", f"SLURM_JOB_ID={claimed}", "/bin/sleep", "300"],
        cwd=WORK / "user", env={"PATH": "/usr/bin:/bin", "HOME": str(WORK / "user")},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _sleep_pid(runner: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """The pid of the ``sleep`` that ``runuser`` started (its child, once ``env`` has exec-ed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmdline = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == runner.pid and cmdline.startswith(b"/bin/sleep"):
                return int(stat.parent.name)
        time.sleep(0.1)
    raise AssertionError("the hostile process did not start")


def _scenario(busy: list[int], uses: dict[int, int]) -> Path:
    """The fake NVML's four GPUs: ``busy`` at 90 %, the rest idle; ``uses`` maps a GPU to the pid on it."""
    from tests.fake_nvml.build import SCENARIOS

    scenario = json.loads((SCENARIOS / "busy_gpus.json").read_text())
    for index, gpu in enumerate(scenario["gpus"]):
        if index not in busy:
            gpu["util_gpu"], gpu["util_mem"] = 0, 0
        gpu["processes"] = [{"pid": uses[index], "used_memory": 1 << 30}] if index in uses else []
    path = WORK / "scenario.json"
    path.write_text(json.dumps(scenario))
    return path


@pytest.fixture(scope="module")
def neighbourhood(postgres: Any, data_dir: Path, admin_token: str) -> Iterator[Neighbourhood]:
    missing = [b for b in (*BINARIES, "/usr/bin/env") if not os.access(b, os.X_OK)]
    if os.geteuid() != 0 or missing:
        _unavailable("the hostile attribution test needs root and " + ", ".join(missing or ["the Slurm binaries"])
                     + "; run `bash tests/slurm/setup_cluster.sh` as root first")
    try:
        import pynvml  # noqa: F401

        from tests.fake_nvml.build import GccMissing, build_fake_nvml

        library = build_fake_nvml()
    except (ImportError, GccMissing) as exc:
        _unavailable(f"the node daemon needs pynvml and the fake NVML: {exc}")
    if queue := busy_queue():
        _unavailable(f"other jobs are in the Slurm queue; the hostile attribution test needs the cluster to itself:\n"
                     f"{queue}")
    user = ordinary_user()
    shutil.rmtree(WORK, ignore_errors=True)
    for sub in ("spool", "daemon", "user"):
        (WORK / sub).mkdir(parents=True, mode=0o755)
    WORK.chmod(0o755)
    os.chown(WORK / "user", user.pw_uid, user.pw_gid)
    secret_file = WORK / "cluster_secret"
    secret_file.write_text(uuid.uuid4().hex * 2 + "\n")
    secret_file.chmod(0o600)
    for stale in REGISTRATIONS.glob("*.json"):
        stale.unlink()

    database_url = create_database(postgres, f"neighbour_{uuid.uuid4().hex[:12]}")
    migrate.upgrade(database_url)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    host = socket.gethostname().split(".")[0]
    shared = {"JOBSIGHT_URL": url, "JOBSIGHT_SECRET_FILE": str(secret_file),
              "JOBSIGHT_SPOOL_DIR": str(WORK / "spool"), "JOBSIGHT_NODE": host}
    _setup_cluster({**shared, "JOBSIGHT_HOOK_LOG": str(WORK / "hooks.log")})
    collector = LiveCollector(database_url, data_dir, admin_token, WORK / "collector.log",
                              env={"JOBSIGHT_SECRET_FILE": str(secret_file), **COLLECTOR_ENV})
    collector.port, collector.url = port, url
    daemon_env = {**os.environ, **shared, "JOBSIGHT_DATA_DIR": str(WORK / "daemon"),
                  "JOBSIGHT_NVML_LIBRARY": str(library), "JOBSIGHT_BATCH_AGE_S": str(DAEMON_BATCH_AGE_S)}
    for name in ("JOBSIGHT_TOKEN", "JOBSIGHT_TOKEN_FILE", "JOBSIGHT_JOB_ID", "JOBSIGHT_REGISTRATION_DIR"):
        daemon_env.pop(name, None)
    daemon = Daemon(daemon_env, WORK / "daemon.log")
    state = Neighbourhood(collector, database_url, host, user.pw_uid)
    runners: list[subprocess.Popen[bytes]] = []
    try:
        collector.start()
        for what in ("victim", "bystander"):
            state.jobs[what] = _sbatch_as_root(what)
            state.gpus[what] = _registered_gpus(state.jobs[what])
        taken = {gpu for gpus in state.gpus.values() for gpu in gpus}
        free = [gpu for gpu in range(4) if gpu not in taken]
        for claimed, gpu in zip((state.jobs["victim"], "--user=root"), free, strict=False):
            runner = _outside_slurm(claimed)
            runners.append(runner)
            state.hostile[claimed] = _sleep_pid(runner)
            state.hostile_gpus[claimed] = gpu
        scenario = _scenario(sorted(taken), {gpu: state.hostile[claimed]
                                             for claimed, gpu in state.hostile_gpus.items()})
        daemon.start(str(scenario))
        yield state
    finally:
        for runner in runners:
            runner.kill()
        for job in state.jobs.values():
            subprocess.run([SCANCEL, "--", job], capture_output=True, timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                job_state(job)[0].split("+")[0] not in FINAL_STATES for job in state.jobs.values()):
            time.sleep(0.3)
        daemon.stop()
        collector.kill()
        _setup_cluster({})  # hooks.env back to JOBSIGHT_BIN only


def _watched(hood: Neighbourhood) -> None:
    """Wait until the victim's own samples span :data:`WATCH_S`: past the idle window and the whole ladder."""
    deadline = time.monotonic() + WATCH_S + 60
    while True:
        span = hood.query("SELECT extract(epoch FROM max(ts) - min(ts)) FROM gpu_samples WHERE job_id = %s",
                          hood.jobs["victim"])[0][0]
        if span is not None and float(span) >= WATCH_S:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the victim's samples span {span} s, not {WATCH_S} s\n{hood.diagnostics()}")
        time.sleep(0.5)


def test_a_process_claiming_another_users_job_changes_nothing_of_it_and_cancels_nothing(
        neighbourhood: Neighbourhood) -> None:
    hood = neighbourhood
    assert len(hood.hostile) == 2, hood.diagnostics()
    _watched(hood)
    victim, bystander = hood.jobs["victim"], hood.jobs["bystander"]
    # The victim keeps its telemetry, of its own GPU only: the claimant's idle GPU is not made its.
    gpus = [row[0] for row in hood.query("SELECT DISTINCT gpu_index FROM gpu_samples WHERE job_id = %s", victim)]
    assert gpus == hood.gpus["victim"], hood.diagnostics()
    fresh = hood.query("SELECT now() - max(ts) < interval '5 seconds' FROM gpu_samples WHERE job_id = %s", victim)
    assert fresh == [(True,)], hood.diagnostics()
    # No job under the option-shaped id, no finding, no step of any policy.
    assert hood.query("SELECT job_id FROM jobs WHERE job_id NOT IN (%s, %s)", victim, bystander) == []
    assert hood.query("SELECT job_id, rule FROM findings") == [], hood.diagnostics()
    assert hood.query("SELECT job_id, step, outcome FROM actions") == [], hood.diagnostics()
    # Slurm still runs both of the other user's jobs.
    assert (hood.state("victim"), hood.state("bystander")) == ("RUNNING", "RUNNING"), hood.diagnostics()


def test_a_gpu_used_outside_any_job_is_reported_for_the_admins(neighbourhood: Neighbourhood) -> None:
    hood = neighbourhood
    expected = sorted((gpu, hood.hostile[claimed], hood.uid) for claimed, gpu in hood.hostile_gpus.items())
    deadline = time.monotonic() + 60
    while True:
        rows = sorted(set(hood.query("SELECT gpu_index, pid, uid FROM gpu_unallocated_uses WHERE node = %s",
                                     hood.host)))
        if rows == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rows == expected, hood.diagnostics()
