"""Per-job host CPU and memory from fixture cgroup v2/v1 and ``/proc`` trees under tmp,
and from the real ``/proc`` for this process."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jobsight.agent.node.host import HostSampler
from jobsight.agent.node.registrations import Registration
from jobsight.protocol import wire


def registered(job_id: str, slurm_job_id: int | None = None, sluid: str | None = None) -> Registration:
    return Registration(cluster="default", job_id=job_id, node="n1", started_us=1, slurm_job_id=slurm_job_id,
                        sluid=sluid)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    job = root / "system.slice" / "slurmstepd.scope" / "job_42"
    write(job / "cpu.stat", "usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\n")
    write(job / "memory.current", "1073741824\n")
    write(job / "memory.max", "8589934592\n")
    write(root / "system.slice" / "slurmstepd.scope" / "job_43" / "memory.max", "max\n")
    clock = Clock()
    sampler = HostSampler(proc_root=str(tmp_path / "proc"), cgroup_root=str(root), clock=clock)

    first = sampler.sample(registered("42"))
    assert first is not None and first.source == "cgroup2"
    assert (first.cpu_time_s, first.cpu_util, first.mem_used, first.mem_limit) == (5.0, None, 1 << 30, 8 << 30)
    write(job / "cpu.stat", "usage_usec 8000000\n")  # 3 CPU seconds in 2 s: one and a half cores
    clock.now += 2
    second = sampler.sample(registered("42"))
    assert second is not None and second.cpu_util == pytest.approx(150.0)

    unlimited = sampler.sample(registered("43"))
    assert unlimited is not None and unlimited.mem_limit is None and unlimited.cpu_time_s is None
    assert sampler.sample(registered("44")) is None  # no cgroup and no pids

    record = {"kind": "host_sample", "job": "42", "ts": wire.now_us(), "node": "n1", **second.to_record()}
    wire.validate_record(record, 0)


def test_cgroup_v2_only_where_slurm_puts_it(tmp_path: Path) -> None:
    """A ``job_<id>`` folder anywhere else is not the job's: not one a job made below its own step
    (which a glob of the tree once found), nor one outside slurmstepd's scope."""
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpu memory\n")
    write(root / "machine.slice" / "slurm" / "job_9" / "memory.current", "10\n")
    mine = root / "system.slice" / "slurmstepd.scope" / "job_8" / "step_0" / "user" / "task_0"
    write(mine / "job_9" / "memory.current", "20\n")
    write(mine.parents[2] / "memory.current", "30\n")
    sampler = HostSampler(cgroup_root=str(root))
    assert sampler.sample(registered("9")) is None
    found = sampler.sample(registered("8"))
    assert found is not None and found.mem_used == 30


def test_cgroup_v1(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    cpu = root / "cpu,cpuacct" / "slurm" / "uid_1000" / "job_77"
    write(cpu / "cpuacct.usage", "2500000000\n")
    memory = root / "memory" / "slurm" / "uid_1000" / "job_77"
    write(memory / "memory.usage_in_bytes", "2048\n")
    write(memory / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    clock = Clock()
    sampler = HostSampler(cgroup_root=str(root), clock=clock)
    first = sampler.sample(registered("77"))
    assert first is not None and first.source == "cgroup1"
    assert (first.cpu_time_s, first.mem_used, first.mem_limit) == (2.5, 2048, None)
    write(memory / "memory.limit_in_bytes", "4096\n")
    write(cpu / "cpuacct.usage", "3500000000\n")
    clock.now += 4
    second = sampler.sample(registered("77"))
    assert second is not None and second.mem_limit == 4096 and second.cpu_util == pytest.approx(25.0)


def test_readings_at_the_precision_the_packed_tier_keeps(tmp_path: Path) -> None:
    """CPU seconds in whole microseconds (v1 counts ns) and CPU percent in hundredths: the
    packed tier keeps such values as integers, any others as floats (4 to 8 times the bytes)."""
    root = tmp_path / "cgroup"
    cpu = root / "cpu,cpuacct" / "slurm" / "uid_1000" / "job_78"
    write(cpu / "cpuacct.usage", "2500000999\n")
    clock = Clock()
    sampler = HostSampler(cgroup_root=str(root), clock=clock)
    first = sampler.sample(registered("78"))
    assert first is not None and first.cpu_time_s == 2.500000
    write(cpu / "cpuacct.usage", "3500001999\n")
    clock.now += 3
    second = sampler.sample(registered("78"))
    assert second is not None and second.cpu_time_s == 3.500001
    assert second.cpu_util == 33.33  # 1.000001 s in 3 s


def proc_stat(pid: int, name: str, utime: int, stime: int) -> str:
    # Fields after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    rest = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime)] + ["0"] * 39
    return f"{pid} ({name}) {' '.join(rest)}\n"


def test_proc_fallback_sums_the_jobs_processes(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    ticks = os.sysconf("SC_CLK_TCK")
    write(proc / "10" / "stat", proc_stat(10, "python (train) x", 3 * ticks, ticks))
    write(proc / "10" / "status", "Name:\tpython\nVmRSS:\t  1024 kB\nThreads:\t4\n")
    write(proc / "11" / "stat", proc_stat(11, "pt_data_worker", ticks, 0))
    write(proc / "11" / "status", "Name:\tpt_data_worker\nVmRSS:\t2048 kB\n")
    clock = Clock()
    sampler = HostSampler(proc_root=str(proc), cgroup_root=str(tmp_path / "no-cgroup"), clock=clock)
    first = sampler.sample(registered("5"), pids=[10, 11, 12])  # 12 ended before it was read
    assert first is not None and first.source == "proc"
    assert (first.cpu_time_s, first.mem_used, first.mem_limit) == (5.0, 3 * 1024 * 1024, None)
    write(proc / "10" / "stat", proc_stat(10, "python (train) x", 5 * ticks, ticks))
    clock.now += 1
    second = sampler.sample(registered("5"), pids=[10, 11])
    assert second is not None and second.cpu_util == pytest.approx(200.0)
    # A process ended: the sum went backwards, so no utilisation this tick rather than a negative one.
    third = sampler.sample(registered("5"), pids=[10])
    assert third is not None and third.cpu_util is None
    assert sampler.sample(registered("5"), pids=[12]) is None


def test_real_proc_for_this_process(tmp_path: Path) -> None:
    sampler = HostSampler(cgroup_root=str(tmp_path / "no-cgroup"))
    first = sampler.sample(registered("self"), pids=[os.getpid()])
    assert first is not None and first.cpu_time_s is not None and first.cpu_time_s > 0
    assert first.mem_used is not None and first.mem_used > 10 * 1024 * 1024  # a Python interpreter
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    second = sampler.sample(registered("self"), pids=[os.getpid()])
    assert second is not None and second.cpu_time_s is not None and second.cpu_util is not None
    assert second.cpu_time_s >= first.cpu_time_s + 0.2
    assert second.cpu_util > 20.0


def test_a_v1_cgroup_without_cpuacct_takes_the_cpu_time_from_the_jobs_processes(tmp_path: Path) -> None:
    """The test cluster's cgroup.conf (tests/slurm/cgroup.conf.in: memory only, jobacct_gather/none): the
    job's v1 folder is in the memory hierarchy alone. Its memory comes from there and its CPU time from
    its processes (which the daemon finds through the reader), never lost; the reading says which."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    memory = root / "memory" / "slurm" / "uid_1000" / "job_61"
    write(memory / "memory.usage_in_bytes", "4096\n")
    write(memory / "memory.limit_in_bytes", "8192\n")
    (root / "cpuacct" / "slurm").mkdir(parents=True)  # the hierarchy is mounted; Slurm made no job there
    ticks = os.sysconf("SC_CLK_TCK")
    write(proc / "10" / "stat", proc_stat(10, "burn", 3 * ticks, ticks))
    write(proc / "10" / "status", "Name:\tburn\nVmRSS:\t1024 kB\n")
    clock = Clock()
    sampler = HostSampler(proc_root=str(proc), cgroup_root=str(root), clock=clock)
    job = registered("61", slurm_job_id=61)
    assert not sampler.counts_cpu(job)
    first = sampler.sample(job, pids=[10])
    assert first is not None
    assert (first.source, first.cpu_source, first.cpu_time_s, first.mem_used, first.mem_limit) == (
        "cgroup1", "proc", 4.0, 4096, 8192)
    write(proc / "10" / "stat", proc_stat(10, "burn", 5 * ticks, ticks))
    clock.now += 2
    second = sampler.sample(job, pids=[10])
    assert second is not None and second.cpu_util == pytest.approx(100.0)
    # Without its processes (the daemon did not look) the memory is still there, the CPU time unknown.
    alone = sampler.sample(job)
    assert alone is not None and (alone.cpu_time_s, alone.cpu_source, alone.mem_used) == (None, None, 4096)
