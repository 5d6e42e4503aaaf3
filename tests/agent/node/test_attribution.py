"""GPU → job attribution and the registration files it starts from.

Processes are traced through fixture ``/proc`` trees under tmp (like prometheus
client's ``tests/proc``) and through the real ``/proc`` with real child processes;
GPU readings come from the real pynvml over the fake libnvidia-ml.so.1. A process's
environment names no job: only registrations and the kernel's cgroups do.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobsight.agent.node import attribution
from jobsight.agent.node.attribution import Attributor, job_from_cgroup, uid_of_pid
from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.agent.node.registrations import (
    Registration,
    RegistrationError,
    has_registration,
    read_registrations,
    remove_registration,
    write_registration,
)
from jobsight.agent.node.slurm_cgroups import pids_by_job

REPO = Path(__file__).resolve().parents[3]
FAKE_DIR = REPO / "tests" / "fake_nvml"

V1_CGROUP = "12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n11:cpuacct,cpu:/slurm/uid_1000/job_4242/step_0\n"
V2_CGROUP = "0::/system.slice/slurmstepd.scope/job_777/step_batch/user/task_0\n"


def make_proc(root: Path, pid: int, environ: dict[str, str] | None = None, cgroup: str | None = None) -> None:
    directory = root / str(pid)
    directory.mkdir(parents=True)
    if environ is not None:
        (directory / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
    if cgroup is not None:
        (directory / "cgroup").write_text(cgroup)


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    make_proc(root, 100, environ={"HOME": "/home/ana", "SLURM_JOB_ID": "7"}, cgroup="0::/user.slice\n")
    make_proc(root, 101, cgroup=V1_CGROUP)
    make_proc(root, 102, environ={"PATH": "/bin"}, cgroup=V2_CGROUP)
    make_proc(root, 103, environ={"SLURM_JOB_ID": "999"}, cgroup=V2_CGROUP)  # the kernel's word wins
    make_proc(root, 104, environ={"PATH": "/bin"}, cgroup="0::/init.scope\n")
    make_proc(root, 105)  # nothing readable (another user's process, without root)
    make_proc(root, 106, environ={"SLURM_JOB_ID": "4242"}, cgroup="0::/system.slice/slurmstepd.scope/job_999/step_0\n")
    (root / "self").mkdir()
    return root


def test_a_process_is_traced_through_its_cgroup_never_its_environment(proc_root: Path) -> None:
    root = str(proc_root)
    jobs = [job_from_cgroup(pid, root) for pid in (100, 101, 102, 103, 104, 105, 106, 107)]
    assert [str(job) if job is not None else None for job in jobs] == [
        None, "4242", "777", "777", None, None, "999", None,
    ]
    # Process 100 says SLURM_JOB_ID=7 and is in no job's cgroup: it is in no job, registered or not.
    registered = [reg("4242"), reg("777"), reg("7")]
    assert pids_by_job(registered, root) == {"4242": [101], "777": [102, 103]}
    assert not hasattr(attribution, "job_from_environ") and not hasattr(attribution, "job_of_pid")


def wait_for_exec(pid: int, argv: list[str], timeout: float = 5.0) -> None:
    """Wait until ``pid`` runs ``argv``: ``Popen`` returns once exec has begun (the close-on-exec
    pipe closes early in exec), before the kernel has laid out the new program's arguments and
    environment, so ``/proc/<pid>/environ`` can still read empty. The kernel sets ``cmdline``
    and ``environ`` in the same step; wait for both."""
    want = "".join(f"{arg}\0" for arg in argv).encode()
    deadline = time.monotonic() + timeout
    while True:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            cmdline = environ = b""
        if cmdline == want and environ:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not exec {argv} within {timeout} s (cmdline {cmdline!r})")
        time.sleep(0.005)


def test_a_real_process_is_not_in_the_job_its_environment_claims() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    child = subprocess.Popen(["sleep", "30"], env={**env, "SLURM_JOB_ID": "31337"})
    try:
        wait_for_exec(child.pid, ["sleep", "30"])
        # The child sits in this test's cgroup, whatever its environment says.
        assert job_from_cgroup(child.pid) == job_from_cgroup(os.getpid()) != "31337"
        assert child.pid not in pids_by_job([reg("31337")]).get("31337", [])
        assert uid_of_pid(child.pid) == os.getuid()
    finally:
        child.kill()
        child.wait()
    assert uid_of_pid(child.pid) is None  # gone


def reading(index: int, *pids: int) -> GpuReading:
    return GpuReading(index, f"GPU-{index}", processes=[(pid, 0) for pid in pids])


def reg(job: str, *gpus: int) -> Registration:
    return Registration(cluster="default", job_id=job, node="n1", started_us=1, gpus=gpus)


def test_attribution_rules(proc_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    attributor = Attributor(str(proc_root))
    regs = [reg("4242", 0, 1), reg("777", 1, 2), reg("7")]
    readings = [
        reading(0, 101),  # registered, and its process agrees
        reading(1, 102),  # shared by two registrations: the one running there
        reading(2),  # registered, idle
        reading(3, 100),  # given to no job; its process says SLURM_JOB_ID=7 (registered here) but is in no job
        reading(4),  # given to no job, idle: no job
        reading(5, 104, 105),  # given to no job, processes of no job
        reading(6, 101, 102),  # given to no job, processes in the cgroups of two jobs registered here: each sees it
        reading(7, 106),  # given to no job, a process of job 999, which is not registered here
    ]
    with caplog.at_level(logging.INFO, logger="jobsight.agent.attribution"):
        result = attributor.attribute(readings, regs)
        assert [jobs for _, jobs, _ in result] == [["4242"], ["777"], ["777"], [], [], [], ["4242", "777"], []]
        assert [outside for _, _, outside in result] == [[], [], [], [(100, 0)], [], [(104, 0), (105, 0)], [],
                                                         [(106, 0)]]
        # Registered to one job but running another's process: the allocation decides, once logged.
        for _ in range(2):
            assert attributor.attribute([reading(2, 101)], regs)[0].jobs == ["777"]
    mismatches = [r for r in caplog.records if "runs processes of job(s) 4242" in r.getMessage()]
    assert len(mismatches) == 1 and mismatches[0].levelno == logging.WARNING
    # A process's environment is never a job, not even to log: the claimed job 7 appears nowhere.
    assert not any("job(s) 7" in r.getMessage() for r in caplog.records)
    # Shared and idle: both registrations see it.
    assert attributor.attribute([reading(1)], regs)[0].jobs == ["4242", "777"]


def test_an_array_tasks_cgroup_names_its_registration(tmp_path: Path) -> None:
    """The cgroup names Slurm's own number of an array task; the registration, ``<array job>_<task>``."""
    root = tmp_path / "proc"
    make_proc(root, 300, cgroup="0::/system.slice/slurmstepd.scope/job_1241/step_0/user/task_0\n")
    task = Registration(cluster="default", job_id="1234_7", node="n1", started_us=1, gpus=(0,), slurm_job_id=1241)
    result = Attributor(str(root)).attribute([reading(1, 300)], [task])
    assert (result[0].jobs, result[0].outside) == (["1234_7"], [])


@pytest.fixture
def job_child() -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    child = subprocess.Popen(["sleep", "30"], env={**env, "SLURM_JOB_ID": "5150"})
    try:
        wait_for_exec(child.pid, ["sleep", "30"])
        yield child
    finally:
        child.kill()
        child.wait()


def test_nvml_process_list_to_job_through_real_proc(
    fake_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_child: subprocess.Popen[bytes]
) -> None:
    scenario = json.loads((FAKE_DIR / "scenarios" / "four_gpus.json").read_text())
    for gpu in scenario["gpus"]:
        gpu["processes"] = []
    scenario["gpus"][3]["processes"] = [{"pid": job_child.pid, "used_memory": 1 << 30}]
    (tmp_path / "scenario.json").write_text(json.dumps(scenario))
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(tmp_path / "scenario.json"))
    with NvmlSampler(str(fake_library)) as sampler:
        readings = sampler.sample()
    result = Attributor().attribute(readings, [reg("1", 0, 1), reg("5150", 2)])
    # GPU 3 was given to no job; its process claims job 5150 (registered here) in its environment only.
    assert [(r.gpu_index, jobs, outside) for r, jobs, outside in result] == [
        (0, ["1"], []), (1, ["1"], []), (2, ["5150"], []), (3, [], [(job_child.pid, 1 << 30)])]


# -- registration files -------------------------------------------------------------


def full_registration(job: str = "123") -> Registration:
    return Registration(
        cluster="c1",
        job_id=job,
        node="gpu01",
        started_us=1_763_769_600_000_000,
        gpus=(0, 3),
        user="ana",
        uid=1000,
        account="physics",
        partition="gpu",
        name="train",
        nodes=("gpu01", "gpu02"),
        node_count=2,
        time_limit_s=3600,
        token_file="/run/jobsight/tokens/123",
        run=2,
    )


def test_registration_round_trip_atomic_and_0644(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "jobs"
    original = full_registration()
    path = write_registration(directory, original)
    assert path == directory / "123.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(os.listdir(directory)) == ["123.json"]  # no temporary file left behind
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["gpus"] == [0, 3] and data["nodes"] == ["gpu01", "gpu02"]
    assert set(data) == {
        "version", "cluster", "job_id", "user", "uid", "account", "partition", "name", "node",
        "nodes", "node_count", "gpus", "time_limit_s", "started_us", "token_file", "run",
    }  # fmt: skip
    assert Registration.from_file(path) == original
    write_registration(directory, Registration(cluster="c1", job_id="124", node="gpu01", started_us=5))
    assert [r.job_id for r in read_registrations(directory)] == ["123", "124"]
    assert read_registrations(directory)[1].gpus == ()
    assert has_registration(directory, "123") and not has_registration(directory, "125")
    assert remove_registration(directory, "123") and not remove_registration(directory, "123")
    assert read_registrations(tmp_path / "nowhere") == []
    with pytest.raises(RegistrationError):
        write_registration(directory, Registration(cluster="c", job_id="../etc/passwd", node="n", started_us=1))


def test_garbled_registrations_are_skipped_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_registration(tmp_path, full_registration("1"))
    (tmp_path / "2.json").write_text("{not json")
    (tmp_path / "3.json").write_text(json.dumps({"version": 1, "job_id": "3", "node": "n", "gpus": [0]}))  # no start
    (tmp_path / "4.json").write_text(json.dumps({**json.loads(full_registration("5").to_json())}))  # wrong name
    (tmp_path / ".6.json.tmp").write_text("{")  # a prolog mid-write
    (tmp_path / "notes.txt").write_text("x")
    # A newer prolog's extra key and a descriptive field of the wrong type do not lose the job.
    newer = {**json.loads(full_registration("7").to_json()), "version": 2, "extra": 1, "account": 5}
    (tmp_path / "7.json").write_text(json.dumps(newer))
    with caplog.at_level(logging.WARNING, logger="jobsight.agent.registrations"):
        assert [r.job_id for r in read_registrations(tmp_path)] == ["1", "7"]
        assert [r.job_id for r in read_registrations(tmp_path)] == ["1", "7"]
    assert read_registrations(tmp_path)[1].account is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3, warned
    assert any("2.json" in w for w in warned) and any("started_us" in w for w in warned)
    assert any("holds job '5'" in w for w in warned)
