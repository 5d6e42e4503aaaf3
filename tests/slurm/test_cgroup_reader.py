"""The one reader of Slurm's cgroup paths on a real Slurm's real cgroup v1 hierarchy (issue #41).

The test cluster (tests/slurm/setup_cluster.sh) runs cgroup/v1 with memory limits only
(tests/slurm/cgroup.conf.in, ``jobacct_gather/none`` in slurm.conf.in): Slurm makes each job a folder in
the memory hierarchy alone (``/slurm/uid_<uid>/job_<id>/step_batch/task_0``, src/plugins/cgroup/v1/
xcgroup.c:414-439 and cgroup_v1.c:339). Two real batch jobs run, one burning a core and one asleep; each
one's batch process's real ``/proc/<pid>/cgroup`` is read through the reader and by its users, and the host
sampler gives the burning job its CPU time from its processes (its cgroup counts none), never nothing.

Needs root and the test cluster; skips otherwise, fails instead with ``JOBSIGHT_REQUIRE_SLURM=1`` (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobsight.agent.node.attribution import Attributor, job_from_cgroup
from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.agent.node.host import HostSampler
from jobsight.agent.node.kineto.process import ProcessJob, job_of_process
from jobsight.agent.node.registrations import Registration
from jobsight.agent.node.slurm_cgroups import JobFolder, find_job_dirs, folders_of, parse_cgroup, pids_by_job
from tests.slurm.slurm_commands import SBATCH, SCANCEL, SINFO
from tests.slurm.test_e2e import FINAL_STATES, SLURM_BINARIES, _unavailable, job_state

pytestmark = pytest.mark.slurm

WORK = Path("/var/tmp/jobsight-cgroup-reader")
START_TIMEOUT_S = 60.0
BURN_TIMEOUT_S = 30.0
CGROUP_ROOT = "/sys/fs/cgroup"
BURN = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"


def _submit(name: str, command: str) -> str:
    script = WORK / f"{name}.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {WORK / name}.pid\nexec {command}\n")
    script.chmod(0o755)
    result = subprocess.run([SBATCH, "--parsable", "-J", name, "-t", "3", "-c", "1", "--mem", "256M",
                             "-o", str(WORK / f"{name}.out"), "-D", str(WORK), str(script)],
                            env={"PATH": "/usr/bin:/bin", "HOME": str(WORK), "LANG": "C.UTF-8"},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def _pid_of(name: str, job: str) -> int:
    """The batch process of job ``job`` (its script wrote its pid, then exec'd its command)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    path = WORK / f"{name}.pid"
    while not path.exists() or not path.read_text().strip():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} ({name}) did not start in {START_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    return int(path.read_text())


@pytest.fixture(scope="module")
def jobs() -> Iterator[dict[str, tuple[str, int]]]:
    """``{"burn": (job id, batch pid), "idle": (...)}``, cancelled afterwards."""
    if os.geteuid() != 0 or not all(os.access(b, os.X_OK) for b in SLURM_BINARIES):
        _unavailable("the cgroup reader's real-Slurm test needs root and Slurm; run tests/slurm/setup_cluster.sh")
    if subprocess.run([SINFO, "-h"], capture_output=True, timeout=10).returncode != 0:
        _unavailable("the test cluster does not answer sinfo; run tests/slurm/setup_cluster.sh")
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True, mode=0o755)
    submitted = {"burn": _submit("burn", f"{sys.executable} -c '{BURN}'"), "idle": _submit("idle", "sleep 120")}
    try:
        yield {name: (job, _pid_of(name, job)) for name, job in submitted.items()}
    finally:
        subprocess.run([SCANCEL, "--", *submitted.values()], capture_output=True, timeout=30)
        # Out of the queue (epilogs run) before the next module wants the cluster to itself.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                job_state(job)[0] not in FINAL_STATES for job in submitted.values()):
            time.sleep(0.3)


def test_a_real_jobs_cgroup_is_read_by_the_reader_and_its_users(jobs: dict[str, tuple[str, int]]) -> None:
    (burn, burn_pid), (idle, idle_pid) = jobs["burn"], jobs["idle"]
    text = Path(f"/proc/{burn_pid}/cgroup").read_text()
    place = parse_cgroup(text)
    assert (place.job, place.step, place.version) == (JobFolder(number=int(burn)), "batch", 1), text
    burning = Registration(cluster="default", job_id=burn, node="n", started_us=1, slurm_job_id=int(burn))
    asleep = Registration(cluster="default", job_id=idle, node="n", started_us=1, slurm_job_id=int(idle))
    registrations = [burning, asleep]

    # Attribution and the Kineto lookup, from the kernel's file; the environment claims the other job.
    assert job_from_cgroup(burn_pid) == JobFolder(number=int(burn))
    attributed = Attributor().attribute([GpuReading(3, "GPU-3", processes=[(burn_pid, 0), (idle_pid, 0)])],
                                        registrations)
    assert (attributed[0].jobs, attributed[0].outside) == ([burn, idle], [])
    assert job_of_process(burn_pid, {"JOBSIGHT_JOB_ID": idle}, {burn: burning, idle: asleep}) == ProcessJob(burn)

    # The job's folders in the real hierarchy: the memory controller's, where this cluster constrains memory.
    dirs = find_job_dirs(CGROUP_ROOT, folders_of(burning))
    memory = dirs.of("memory") if dirs is not None else None
    assert dirs is not None and dirs.version == 1 and memory is not None, text
    assert memory.endswith(f"/uid_0/job_{burn}") and os.path.isdir(memory)
    by_job = pids_by_job(registrations)
    assert burn_pid in by_job[burn] and idle_pid in by_job[idle] and burn_pid not in by_job[idle]

    # The host sampler: memory from the cgroup, CPU time from the cgroup where it counts it, else from the
    # job's processes; the burning job's grows, the sleeping one's does not.
    sampler = HostSampler()
    first = {job.job_id: sampler.sample(job, pids_by_job(registrations).get(job.job_id, [])) for job in registrations}
    for reading in first.values():
        assert reading is not None and reading.source == "cgroup1" and reading.mem_used is not None
        assert reading.cpu_time_s is not None
        assert reading.cpu_source == ("cgroup1" if sampler.counts_cpu(burning) else "proc")
    deadline = time.monotonic() + BURN_TIMEOUT_S
    while True:
        burnt = sampler.sample(burning, pids_by_job(registrations).get(burn, []))
        assert burnt is not None and burnt.cpu_time_s is not None
        if burnt.cpu_time_s >= first[burn].cpu_time_s + 1.0:  # type: ignore[union-attr,operator]
            break
        assert time.monotonic() < deadline, f"job {burn} used no CPU time in {BURN_TIMEOUT_S:.0f} s: {burnt}"
        time.sleep(0.5)
    slept = sampler.sample(asleep, pids_by_job(registrations).get(idle, []))
    assert slept is not None and slept.cpu_time_s is not None and slept.cpu_time_s < 0.5
