"""The one reader of Slurm's cgroup paths, and each of its four users, on every layout Slurm builds.

cgroup v2 cannot run on these machines (v1 is mounted, and slurmd refuses hybrid mode), so each layout is
a directory tree made here with the exact paths Slurm 26.05.3 builds (file and lines in each layout's
comment), with a ``/proc/<pid>/cgroup`` as the kernel writes it for a task there. The v1 layouts are also
read on the real hierarchy of the test cluster (tests/slurm/test_cgroup_reader.py).

For each layout the job is found by the reader (the process's job and step, the job's directories, the
job's processes), by attribution (a GPU's process traced to the registered job), by the Kineto service's
process lookup, by the host sampler (the job's CPU time and memory from that layout's files) and by the
energy split (the job's cores, from its cpuset). The process's environment claims another job each time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobsight.agent.node.attribution import Attributor, job_from_cgroup
from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.agent.node.host import HostSampler
from jobsight.agent.node.kineto.process import ProcessJob, job_of_process
from jobsight.agent.node.registrations import Registration
from jobsight.agent.node.slurm_cgroups import (
    JobFolder,
    SlurmPath,
    find_job_dirs,
    folders_of,
    parse_cgroup,
    parse_path,
    pids_by_job,
    registration_of,
)

SLUID = "s8FXKTA79XAR00"  # print_sluid's form (src/common/sluid.c:116-135): "s" + 13 Crockford base-32
PID, OTHER_PID = 4100, 4101
NODE = "node7"


@dataclass(frozen=True)
class Layout:
    version: int
    job_dir: str
    """The job's folder, from the v2 root or from each v1 controller's mount."""
    below: str
    """The task's folder below the job's."""
    step: str
    node: str | None = None
    sluid: str | None = None
    """Where the folder is the SLUID, the registration's; ``None``: a ``job_<id>`` folder."""


LAYOUTS = {
    # v1: /slurm (src/interfaces/cgroup.c:196, xcgroup.c:375), uid_%u (xcgroup.c:414), job_%u (:424),
    # step_%s (:439, the step as log.c:1745-1755 prints it), task_%u (src/plugins/cgroup/v1/cgroup_v1.c:339).
    "v1, one slurmd, step 0": Layout(1, "slurm/uid_1000/job_4242", "step_0/task_0", "0"),
    "v1, one slurmd, batch": Layout(1, "slurm/uid_1000/job_4242", "step_batch/task_0", "batch"),
    # Several slurmd per host (MULTIPLE_SLURMD): /slurm_%n (cgroup.c:198, xcgroup.c:365-371).
    "v1, several slurmd, extern": Layout(1, f"slurm_{NODE}/uid_1000/job_4242", "step_extern/task_0", "extern",
                                         NODE),
    # v2: <slice>/slurmstepd.scope (cgroup_v2.c:445-446, slice system.slice :67, :436-438), job_%u with
    # CgroupJobIdPaths=yes (:1932-1933), step_%s (:1954-1958), user (:1985), task_%u (:2765-2766).
    "v2, job_<id>, step 0": Layout(2, "system.slice/slurmstepd.scope/job_4242", "step_0/user/task_0", "0"),
    "v2, job_<id>, het step": Layout(2, "system.slice/slurmstepd.scope/job_4242", "step_1+1/user/task_3", "1+1"),
    # v2 default since 26.05: the SLUID folder (cgroup_v2.c:1934-1936).
    "v2, SLUID, batch": Layout(2, f"system.slice/slurmstepd.scope/{SLUID}", "step_batch/user/task_0", "batch",
                               sluid=SLUID),
    "v2, SLUID, step 0": Layout(2, f"system.slice/slurmstepd.scope/{SLUID}", "step_0/user/task_1", "0",
                                sluid=SLUID),
    # v2, several slurmd: <node>_slurmstepd.scope (cgroup_v2.c:441-443); the extern step's adopted
    # processes go to task_special (:2055-2067, :2762-2764).
    "v2, several slurmd, extern": Layout(2, f"system.slice/{NODE}_slurmstepd.scope/job_4242",
                                         "step_extern/user/task_special", "extern", NODE),
    "v2, several slurmd, SLUID": Layout(2, f"system.slice/{NODE}_slurmstepd.scope/{SLUID}",
                                        "step_interactive/user/task_0", "interactive", NODE, SLUID),
}
V1_CONTROLLERS = ("memory", "cpu,cpuacct", "cpuset")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def registration(job_id: str = "4242", *, slurm_job_id: int | None = 4242, sluid: str | None = None,
                 node: str = NODE, gpus: tuple[int, ...] = ()) -> Registration:
    return Registration(cluster="default", job_id=job_id, node=node, started_us=1, gpus=gpus,
                        slurm_job_id=slurm_job_id, sluid=sluid)


def cgroup_file(layout: Layout) -> str:
    """``/proc/<pid>/cgroup`` of a task in ``layout`` as the kernel writes it."""
    path = f"/{layout.job_dir}/{layout.below}"
    if layout.version == 2:
        return f"0::{path}\n"
    return (f"11:memory:{path}\n10:cpuset:{path}\n4:cpu,cpuacct:{path}\n"
            "1:name=systemd:/system.slice/slurmd.service\n0::/system.slice/slurmd.service\n")


def make_tree(root: Path, layout: Layout) -> None:
    """The cgroup tree of ``layout`` with the job's CPU time (12.5 s), memory (1 GiB of 4) and cpuset (4 CPUs)."""
    if layout.version == 2:
        write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
        job = root / layout.job_dir
        write(job / "cpu.stat", "usage_usec 12500000\nuser_usec 12000000\nsystem_usec 500000\n")
        write(job / "memory.current", f"{1 << 30}\n")
        write(job / "memory.max", f"{4 << 30}\n")
        write(job / "cpuset.cpus.effective", "0-1,4,6\n")
        (job / layout.below).mkdir(parents=True)
        (job / layout.below.split("/")[0] / "slurm").mkdir()  # slurmstepd's own (cgroup_v2.c:2009)
        return
    for controller in V1_CONTROLLERS:
        (root / controller / layout.job_dir / layout.below).mkdir(parents=True)
    write(root / "cpu,cpuacct" / layout.job_dir / "cpuacct.usage", "12500000000\n")
    write(root / "memory" / layout.job_dir / "memory.usage_in_bytes", f"{1 << 30}\n")
    write(root / "memory" / layout.job_dir / "memory.limit_in_bytes", f"{4 << 30}\n")
    write(root / "cpuset" / layout.job_dir / "cpuset.cpus", "0-1,4,6\n")
    (root / "cpu").symlink_to("cpu,cpuacct")  # as systemd mounts them
    (root / "cpuacct").symlink_to("cpu,cpuacct")


def make_process(proc: Path, pid: int, cgroup: str, **env: str) -> None:
    write(proc / str(pid) / "cgroup", cgroup)
    (proc / str(pid) / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layout_is_found_by_the_reader_and_its_four_users(tmp_path: Path, name: str) -> None:
    layout = LAYOUTS[name]
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    make_tree(root, layout)
    mine = registration(sluid=layout.sluid, slurm_job_id=4242)
    other = registration("4243", slurm_job_id=4243, gpus=(0,))  # the user's other job, which the process claims
    make_process(proc, PID, cgroup_file(layout), SLURM_JOB_ID="4243", JOBSIGHT_JOB_ID="4243")
    make_process(proc, OTHER_PID, "0::/user.slice/user-1000.slice/session-3.scope\n")  # outside Slurm
    folder = JobFolder(sluid=SLUID) if layout.sluid else JobFolder(number=4242)

    # The reader: the process's job, step and node; the job's folders; the job's processes.
    place = parse_cgroup(cgroup_file(layout))
    assert (place.job, place.step, place.node, place.version) == (folder, layout.step, layout.node, layout.version)
    dirs = find_job_dirs(str(root), folders_of(mine), mine.node)
    assert dirs is not None and dirs.version == layout.version
    if layout.version == 2:
        assert dirs.of("memory") == str(root / layout.job_dir)
    else:
        assert {c: dirs.of(c) for c in ("cpuacct", "memory", "cpuset")} == {
            "cpuacct": str(root / "cpu,cpuacct" / layout.job_dir), "memory": str(root / "memory" / layout.job_dir),
            "cpuset": str(root / "cpuset" / layout.job_dir)}
    assert pids_by_job([other, mine], str(proc)) == {"4242": [PID]}

    # Attribution: a GPU no job was given runs the process: it works for the job its cgroup names.
    assert job_from_cgroup(PID, str(proc)) == folder
    attributed = Attributor(str(proc)).attribute([GpuReading(3, "GPU-3", processes=[(PID, 0)])], [other, mine])
    assert (attributed[0].jobs, attributed[0].outside) == (["4242"], [])

    # Kineto's process lookup: the cgroup's job, not the one the environment names.
    registered = {"4242": mine, "4243": other}
    assert job_of_process(PID, {"JOBSIGHT_JOB_ID": "4243"}, registered, str(proc)) == ProcessJob("4242")

    # The host sampler: the job's CPU time and memory from this layout's files.
    sampler = HostSampler(proc_root=str(proc), cgroup_root=str(root))
    reading = sampler.sample(mine)
    assert reading is not None
    assert (reading.cpu_time_s, reading.mem_used, reading.mem_limit) == (12.5, 1 << 30, 4 << 30)
    assert (reading.source, reading.cpu_source) == (f"cgroup{layout.version}",) * 2
    # The energy split's cores: the job's cpuset.
    assert sampler.cores("4242") == 4


def test_a_sluid_folder_is_the_job_only_through_its_registrations_sluid(tmp_path: Path) -> None:
    """Slurm 26.05's default folder names no number: a registration without the SLUID (an older
    prolog's, or another run's SLUID) is never matched to it, not even when its number is the job's."""
    layout = LAYOUTS["v2, SLUID, batch"]
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    make_tree(root, layout)
    make_process(proc, PID, cgroup_file(layout), SLURM_JOB_ID="4242")
    for unmatched in (registration(), registration(sluid="s8FXKTA79XAR01")):
        assert registration_of(JobFolder(sluid=SLUID), [unmatched]) is None
        assert find_job_dirs(str(root), folders_of(unmatched), NODE) is None
        assert pids_by_job([unmatched], str(proc)) == {}
        assert job_of_process(PID, {"JOBSIGHT_JOB_ID": "4242"}, {"4242": unmatched}, str(proc)) == ProcessJob(
            None, "job not registered here")
        attributed = Attributor(str(proc)).attribute([GpuReading(3, "GPU-3", processes=[(PID, 0)])], [unmatched])
        assert (attributed[0].jobs, attributed[0].outside) == ([], [(PID, 0)])
        assert HostSampler(proc_root=str(proc), cgroup_root=str(root)).sample(unmatched) is None
    # CgroupJobIdPaths=yes (cgroup_v2.c:1932-1933): the same registration finds job_<id>, the SLUID tried first.
    both = registration(sluid=SLUID)
    assert folders_of(both) == (JobFolder(sluid=SLUID), JobFolder(number=4242))


HOSTILE = {
    # A job may make cgroups of its own below its step; a folder there named for another job names none.
    "v2, job_<id> below the task": ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/job_999/x\n",
                                    "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/job_999"),
    "v2, a SLUID below the step": (f"0::/system.slice/slurmstepd.scope/{SLUID}/step_0/user/s0000000000999\n",
                                   f"system.slice/slurmstepd.scope/{SLUID}/step_0/user/s0000000000999"),
    "v2, a scope below the task": ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/"
                                   "slurmstepd.scope/job_999/step_0\n",
                                   "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/slurmstepd.scope/job_999"),
    "v1, job_<id> below the task": ("11:memory:/slurm/uid_1000/job_4242/step_0/task_0/job_999\n",
                                    "memory/slurm/uid_1000/job_4242/step_0/task_0/job_999"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_folder_a_job_made_below_its_step_names_no_other_job(tmp_path: Path, name: str) -> None:
    cgroup, hostile_dir = HOSTILE[name]
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    if name.startswith("v2"):
        write(root / "cgroup.controllers", "cpu memory\n")
    write(root / hostile_dir / ("memory.current" if name.startswith("v2") else "memory.usage_in_bytes"), "5\n")
    make_process(proc, PID, cgroup, JOBSIGHT_JOB_ID="999")
    victim = registration("999", slurm_job_id=999, sluid="s0000000000999", gpus=(0,))
    mine = registration(sluid=SLUID)
    place = parse_cgroup(cgroup)
    assert place.in_slurm and place.job in (JobFolder(number=4242), JobFolder(sluid=SLUID))
    assert job_from_cgroup(PID, str(proc)) == place.job
    assert pids_by_job([victim], str(proc)) == {}
    assert job_of_process(PID, {}, {"999": victim, "4242": mine}, str(proc)) == ProcessJob("4242")
    attributed = Attributor(str(proc)).attribute([GpuReading(0, "GPU-0", processes=[(PID, 0)])], [victim, mine])
    assert attributed[0].jobs == ["999"]  # the GPU's registration decides; the process is logged as 4242's
    assert Attributor(str(proc)).process_jobs(attributed[0].reading, [victim, mine]) == ["4242"]
    # The folder the job made is not the victim's cgroup: the host sampler does not read it.
    assert find_job_dirs(str(root), folders_of(victim), NODE) is None
    assert HostSampler(proc_root=str(proc), cgroup_root=str(root)).sample(victim) is None


def test_a_scope_outside_the_slices_names_no_job_and_its_process_is_not_taken_at_its_word(tmp_path: Path) -> None:
    """systemd delegates ``user@<uid>.service`` to its user, who may make any folder there: a
    ``slurmstepd.scope/job_999`` in it is no Slurm job's, and its process, looking like one of Slurm's,
    is not taken at its environment's word either. The host sampler never looks there."""
    path = "user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_999"
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    write(root / "cgroup.controllers", "cpu memory\n")
    write(root / path / "memory.current", "5\n")
    make_process(proc, PID, f"0::/{path}/step_0/user/task_0\n")
    victim = registration("999", slurm_job_id=999)
    assert parse_cgroup(f"0::/{path}/step_0/user/task_0\n").job is None
    assert parse_cgroup(f"0::/{path}/step_0/user/task_0\n").in_slurm
    assert job_of_process(PID, {"JOBSIGHT_JOB_ID": "999"}, {"999": victim}, str(proc)) == ProcessJob(
        None, "in no single Slurm job's cgroup")
    assert find_job_dirs(str(root), folders_of(victim)) is None


def test_the_paths_slurm_builds_read_at_their_depths() -> None:
    # Slurm's own cgroups, in Slurm but in no job: the scope's "system" (slurmd's stepd), v1's uid level.
    assert parse_path("/system.slice/slurmstepd.scope/system", 2) == SlurmPath(2)
    assert parse_path("/slurm/uid_0", 1) == SlurmPath(1)
    assert parse_path(f"/slurm_{NODE}", 1) == SlurmPath(1, NODE)
    # slurmstepd itself, in its step's "slurm" leaf (cgroup_v2.c:2009).
    stepd = parse_path("/system.slice/slurmstepd.scope/job_7/step_batch/slurm", 2)
    assert stepd is not None and (stepd.job, stepd.step) == (JobFolder(number=7), "batch")
    # A slice nested as systemd nests "a-b.slice" (CgroupSlice=a-b.slice) and no slice at all.
    assert parse_path("/a.slice/a-b.slice/slurmstepd.scope/job_7/step_0", 2).job == JobFolder(number=7)  # type: ignore[union-attr]
    assert parse_path("/slurmstepd.scope/job_7/step_TBD", 2).step == "TBD"  # type: ignore[union-attr]
    # v1 has no SLUID folders (xcgroup.c:424); v2 paths are not v1's and v1's are not v2's.
    assert parse_path(f"/slurm/uid_0/{SLUID}/step_0", 1).job is None  # type: ignore[union-attr]
    assert parse_path("/slurm/uid_0/job_7/step_0", 2) is None
    assert parse_path("/system.slice/slurmstepd.scope/job_7", 1) is None
    # Digits of other scripts, a job number past Slurm's 32 bits, a SLUID spelled as Slurm never prints it.
    for folder in ("job_٤٢", "job_12345678901", "s8fxkta79xar00", "sU000000000000", "job_"):
        assert parse_path(f"/system.slice/slurmstepd.scope/{folder}/step_0", 2).job is None  # type: ignore[union-attr]


def test_lines_that_name_two_jobs_name_none() -> None:
    two = parse_cgroup("4:memory:/slurm/uid_0/job_4301/step_0\n5:cpuset:/slurm/uid_0/job_4399/step_0\n")
    assert two.in_slurm and two.job is None
    steps = parse_cgroup("4:memory:/slurm/uid_0/job_4301/step_0/task_0\n5:cpuset:/slurm/uid_0/job_4301/step_1\n")
    assert (steps.job, steps.step) == (JobFolder(number=4301), None)
    outside = parse_cgroup("0::/user.slice/user-0.slice/session-1.scope\n1:name=systemd:/\n")
    assert not outside.in_slurm and outside.job is None


def test_several_slurmd_the_registrations_node_first(tmp_path: Path) -> None:
    """A job on two of one host's slurmd (MULTIPLE_SLURMD) has a folder under each node's scope: each
    node's registration reads its own."""
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpu memory\n")
    for node in ("node7", "node8"):
        write(root / "system.slice" / f"{node}_slurmstepd.scope" / "job_5" / "memory.current", "1\n")
    for node in ("node7", "node8"):
        dirs = find_job_dirs(str(root), (JobFolder(number=5),), node)
        scope = root / "system.slice" / f"{node}_slurmstepd.scope"
        assert dirs is not None and dirs.of("memory") == str(scope / "job_5")


def test_the_real_proc_of_this_process_names_no_slurm_job() -> None:
    """This process is in no Slurm job (the tests run outside Slurm): the reader says so from the kernel's file."""
    if "SLURM_JOB_ID" in os.environ:
        pytest.skip("the tests run inside a Slurm job")
    place = parse_cgroup(Path("/proc/self/cgroup").read_text())
    assert place.job is None and not place.in_slurm


REAL_V1 = Path("/sys/fs/cgroup")


@pytest.fixture
def real_v1_job() -> Iterator[tuple[int, int, str]]:
    """A real process in real cgroup v1 folders laid out as several slurmd's Slurm makes them
    (``/slurm_<node>/uid_<uid>/job_<id>/step_0/task_0`` in the memory and cpuacct hierarchies, xcgroup.c:365-439,
    cgroup_v1.c:339): ``(pid, job number, node)``. Removed afterwards; skipped where cgroups cannot be made."""
    if os.geteuid() != 0 or not (REAL_V1 / "memory").is_dir() or (REAL_V1 / "cgroup.controllers").exists():
        pytest.skip("needs root and a cgroup v1 memory hierarchy")
    node, job = f"jstest{uuid.uuid4().hex[:8]}", 4_000_000_000 + os.getpid() % 1_000_000
    tops = [REAL_V1 / controller / f"slurm_{node}" for controller in ("memory", "cpuacct")]
    tasks = [top / f"uid_{os.getuid()}" / f"job_{job}" / "step_0" / "task_0" for top in tops]
    child: subprocess.Popen[bytes] | None = None
    try:
        for task in tasks:
            try:
                task.mkdir(parents=True)
            except OSError as exc:
                pytest.skip(f"cannot make a cgroup here: {exc}")
        child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(10000))"])
        for task in tasks:
            (task / "cgroup.procs").write_text(str(child.pid))  # what slurmstepd does with a task
        yield child.pid, job, node
    finally:
        if child is not None:
            child.kill()
            child.wait()
        for task in tasks:
            for folder in (task, *task.parents):
                if folder == REAL_V1 or folder.parent == REAL_V1:
                    break
                try:
                    folder.rmdir()
                except OSError:
                    pass


def test_the_several_slurmd_v1_layout_on_the_real_hierarchy(real_v1_job: tuple[int, int, str]) -> None:
    pid, job, node = real_v1_job
    mine = registration(str(job), slurm_job_id=job, node=node)
    place = parse_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
    assert (place.job, place.step, place.node, place.version) == (JobFolder(number=job), "0", node, 1)
    assert job_from_cgroup(pid) == JobFolder(number=job)
    assert job_of_process(pid, {"JOBSIGHT_JOB_ID": "4243"}, {str(job): mine}) == ProcessJob(str(job))
    assert pid in pids_by_job([mine]).get(str(job), [])
    dirs = find_job_dirs(str(REAL_V1), folders_of(mine), node)
    folder = REAL_V1 / "memory" / f"slurm_{node}" / f"uid_{os.getuid()}" / f"job_{job}"
    assert dirs is not None and dirs.of("memory") == str(folder)
    sampler = HostSampler()
    deadline = time.monotonic() + 20
    while (reading := sampler.sample(mine)) is not None and not (reading.cpu_time_s or 0) > 0.05:
        assert time.monotonic() < deadline, reading
        time.sleep(0.1)
    assert reading is not None and (reading.source, reading.cpu_source) == ("cgroup1", "cgroup1")
    assert reading.mem_used is not None and reading.mem_used > 0
