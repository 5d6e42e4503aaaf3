"""The node's energy beside its GPUs, split across the jobs of the node by CPU time.

RAPL is read from a powercap tree in the kernel's exact layout under a test root (the zones are
flat links under ``/sys/class/powercap`` on a real node, plain directories here: the reader only
opens files by path); ``/proc/stat`` and the jobs' cgroup v2 files are written by the test between
ticks. The daemon runs in this process over the fake GPUs and ships to a real collector.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.agent.node.daemon import NodeDaemon
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.agent.node.power.energy_split import JobCpu, count_cpus, read_cpu_times, split
from jobsight.agent.node.power.node_energy import BmcPower, NodeEnergy
from jobsight.agent.node.power.rapl import RaplCounters, find_zones
from jobsight.agent.node.power.reader import BackgroundPowerReader
from jobsight.agent.node.registrations import Registration, write_registration
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.protocol import wire

TICKS = os.sysconf("SC_CLK_TCK")
RANGE_UJ = 262_143_328_850  # a real package's max_energy_range_uj


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def zone(root: Path, name: str, label: str, energy_uj: int) -> None:
    write(root / name / "name", label + "\n")
    write(root / name / "max_energy_range_uj", f"{RANGE_UJ}\n")
    write(root / name / "energy_uj", f"{energy_uj}\n")
    write(root / name / "enabled", "1\n")


def powercap(root: Path, package0: int, dram0: int, package1: int, dram1: int, noise: int) -> None:
    """Two sockets with DRAM; ``core``, ``psys`` and the MMIO copy of package 0 are there too and must
    not be counted (they overlap the packages)."""
    zone(root, "intel-rapl:0", "package-0", package0)
    zone(root, "intel-rapl:0:0", "core", noise)
    zone(root, "intel-rapl:0:1", "dram", dram0)
    zone(root, "intel-rapl:1", "package-1", package1)
    zone(root, "intel-rapl:1:0", "dram", dram1)
    zone(root, "intel-rapl:2", "psys", noise)
    zone(root, "intel-rapl-mmio:0", "package-0", noise)
    write(root / "intel-rapl" / "enabled", "1\n")  # the control type's own directory


def proc_stat(proc: Path, busy_s: float, idle_s: float, cores: int = 8) -> None:
    """``/proc/stat`` with ``busy_s`` CPU seconds as user time and ``idle_s`` as idle, all cores together."""
    user, idle = round(busy_s * TICKS), round(idle_s * TICKS)
    lines = [f"cpu  {user} 0 0 {idle} 0 0 0 0 0 0"]
    lines += [f"cpu{i} {user // cores} 0 0 {idle // cores} 0 0 0 0 0 0" for i in range(cores)]
    write(proc / "stat", "\n".join([*lines, "intr 0", "ctxt 0", "btime 0"]) + "\n")


def job_cgroup(cgroups: Path, slurm_job_id: int, cpu_s: float, cpus: str) -> None:
    """Job ``slurm_job_id``'s cgroup v2 folder where Slurm makes it (src/plugins/cgroup/v2/cgroup_v2.c:1932)."""
    base = cgroups / "system.slice" / "slurmstepd.scope" / f"job_{slurm_job_id}"
    write(base / "cpu.stat", f"usage_usec {round(cpu_s * 1e6)}\nuser_usec 0\nsystem_usec 0\n")
    write(base / "cpuset.cpus.effective", cpus + "\n")
    write(base / "memory.current", "1048576\n")
    write(base / "memory.max", "max\n")


def test_the_split_by_cpu_time_and_cores() -> None:
    jobs = {"a": JobCpu(12.0, 4), "b": JobCpu(4.0, 2)}
    # 1,300 J over 40 CPU-seconds of which 20 busy: a used 12, b 4; the idle half by 4 and 2 of 8 cores.
    assert split(1300.0, 20.0, 40.0, 8, jobs, "cores") == pytest.approx({"a": 390 + 325, "b": 130 + 162.5})
    assert split(1300.0, 20.0, 40.0, 8, jobs, "none") == pytest.approx({"a": 390, "b": 130})
    # Jobs' CPU time read a moment after the node's: never more than the busy part between them.
    over = split(100.0, 10.0, 40.0, 8, {"a": JobCpu(15.0, None), "b": JobCpu(5.0, None)}, "none")
    assert sum(over.values()) == pytest.approx(100.0 * 10 / 40)
    # Cores given twice (oversubscribed) share the idle part, never more than it.
    twice = split(80.0, 0.0, 40.0, 8, {"a": JobCpu(0.0, 8), "b": JobCpu(0.0, 8)}, "cores")
    assert twice == pytest.approx({"a": 40.0, "b": 40.0})
    assert count_cpus("0-3,8,10-11") == 7 and count_cpus("") is None and count_cpus("x") is None


def test_rapl_counts_packages_and_dram_through_a_wrap(tmp_path: Path) -> None:
    root = tmp_path / "powercap"
    powercap(root, 1_000_000, 50_000, RANGE_UJ - 200_000_000, 70_000, 5)
    assert [z.name for z in find_zones(str(root))] == ["package-0", "dram", "package-1", "dram"]
    counters = RaplCounters(str(root))
    assert counters.energy_since_last(0.0, 0.0) is None  # the first read is the baseline
    # package 1 wraps: 200 J to the top of its range, then 300 J more.
    powercap(root, 601_000_000, 100_050_000, 300_000_000, 100_070_000, 9_999_000_000)
    assert counters.energy_since_last(0.0, 5.0) == pytest.approx(600 + 100 + 500 + 100)
    (root / "intel-rapl:1:0" / "energy_uj").unlink()  # a zone that cannot be read: no figure this tick
    assert counters.energy_since_last(0.0, 10.0) is None


def test_no_rapl_zone_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    counters = RaplCounters(str(tmp_path))
    assert counters.energy_since_last(0.0, 0.0) is None and counters.energy_since_last(0.0, 1.0) is None
    assert sum("no readable RAPL" in r.getMessage() for r in caplog.records) == 1


def test_cpu_times_of_the_node(tmp_path: Path) -> None:
    proc_stat(tmp_path, 30.0, 10.0, cores=4)
    times = read_cpu_times(str(tmp_path))
    assert times is not None and (times.busy_s, times.total_s, times.cores) == pytest.approx((30.0, 40.0, 4))
    assert read_cpu_times(str(tmp_path / "absent")) is None


def test_two_jobs_sharing_a_node_get_their_joules(
    live_collector: Any, db: psycopg.Connection[Any], fake_library: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two jobs on one node with RAPL: tick 1 is the baseline; over the next 5 s the packages and DRAM
    use 1,300 J (package 1's counter wrapping), the node's 8 cores are busy half the time, job a used
    12 CPU-seconds on its 4 cores and job b 4 on its 2. Job a gets 1,300 × 12/40 + 650 × 4/8 = 715 J
    and b 1,300 × 4/40 + 650 × 2/8 = 292.5 J; the rest (system time, the 2 cores nobody holds) is
    nobody's. Each host sample says the source and the split; the summary adds them up."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(Path(__file__).parents[3] / "fake_nvml" / "scenarios"
                                                 / "four_gpus.json"))
    node = f"node-{tmp_path.name}"
    proc, cgroups, root = tmp_path / "proc", tmp_path / "cgroup", tmp_path / "powercap"
    write(cgroups / "cgroup.controllers", "cpuset cpu io memory pids\n")
    jobs = {"a": f"{tmp_path.name[-6:]}1", "b": f"{tmp_path.name[-6:]}2"}
    numbers = {"a": 8101, "b": 8102}  # Slurm's own numbers, which name the cgroups (the registration joins them)
    registrations = tmp_path / "jobs"
    for gpu, (what, job) in enumerate(jobs.items()):
        write_registration(registrations, Registration(cluster="default", job_id=job, node=node,
                                                       started_us=wire.now_us(), gpus=(gpu,), user="ana",
                                                       slurm_job_id=numbers[what]))
    settings = AgentSettings(url=live_collector.url, token=live_collector.token, node=node,
                             spool_dir=str(tmp_path / "spool"), data_dir=str(tmp_path / "data"), batch_age_s=0.2)
    powercap(root, 1_000_000, 50_000, RANGE_UJ - 200_000_000, 70_000, 5)
    energy = NodeEnergy(RaplCounters(str(root)), "cores", proc_root=str(proc))
    sampler = NvmlSampler(library_path=str(fake_library))
    shipper = Shipper(settings)
    daemon = NodeDaemon(settings, sampler, shipper, registration_dir=str(registrations), proc_root=str(proc),
                        cgroup_root=str(cgroups), energy=energy)
    try:
        proc_stat(proc, 100.0, 100.0)
        job_cgroup(cgroups, numbers["a"], 50.0, "0-3")
        job_cgroup(cgroups, numbers["b"], 20.0, "4,6")
        daemon.tick()
        powercap(root, 601_000_000, 100_050_000, 300_000_000, 100_070_000, 9_999_000_000)
        proc_stat(proc, 120.0, 120.0)
        job_cgroup(cgroups, numbers["a"], 62.0, "0-3")
        job_cgroup(cgroups, numbers["b"], 24.0, "4,6")
        daemon.tick()
        assert shipper.flush(10.0)
    finally:
        shipper.shutdown(2.0)
        sampler.close()
    rows = {job: db.execute("SELECT energy_j, power_source, energy_split FROM host_samples WHERE job_id = %s "
                            "ORDER BY ts", (job,)).fetchall() for job in jobs.values()}
    assert rows[jobs["a"]][0] == (None, None, None)  # the baseline tick has no interval
    assert rows[jobs["a"]][1][0] == pytest.approx(715.0, rel=1e-6)
    assert rows[jobs["b"]][1][0] == pytest.approx(292.5, rel=1e-6)
    assert rows[jobs["a"]][1][1:] == ("rapl", "cpu_time+idle_cores")



def test_a_bmc_reading_less_the_gpus_over_the_tick() -> None:
    """A BMC's whole-node watts less the GPUs' NVML watts, times the tick; nothing for a tick whose GPU
    power NVML could not give, nor once the BMC's last reading is stale (it stopped answering)."""
    clock = [0.0]
    reader = BackgroundPowerReader("ipmi", lambda: 1000.0, 10.0, clock=lambda: clock[0])
    reader.read_once()
    power = BmcPower(reader, max_age_s=30.0)
    assert power.energy_since_last(600.0, 0.0) is None  # the first tick: no interval yet
    assert power.energy_since_last(600.0, 5.0) == pytest.approx(400.0 * 5)
    assert power.energy_since_last(1100.0, 10.0) == 0.0  # the wall reads below the boards: nothing, never less
    assert power.energy_since_last(None, 15.0) is None
    clock[0] = 31.0
    assert power.energy_since_last(600.0, 20.0) is None


def job_process(proc: Path, pid: int, slurm_job_id: int, cpu_s: float) -> None:
    """A task of job ``slurm_job_id`` in the test cluster's v1 memory cgroup (xcgroup.c:414-439, cgroup_v1.c:339),
    with ``cpu_s`` CPU seconds used so far."""
    path = f"/slurm/uid_1000/job_{slurm_job_id}/step_batch/task_0"
    write(proc / str(pid) / "cgroup", f"11:memory:{path}\n4:cpu,cpuacct:/\n0::/system.slice/slurmd.service\n")
    fields = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(round(cpu_s * TICKS)), "0", *["0"] * 39]
    write(proc / str(pid) / "stat", f"{pid} (task) {' '.join(fields)}\n")
    write(proc / str(pid) / "status", "Name:\ttask\nVmRSS:\t1024 kB\n")


def test_a_job_whose_cgroup_counts_no_cpu_time_gets_its_share_from_its_processes(
    live_collector: Any, db: psycopg.Connection[Any], fake_library: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test cluster's cgroups (tests/slurm/cgroup.conf.in: v1, memory only, no cpuacct, no cpuset): job a
    burns 12 CPU-seconds over the tick beside job b, idle. Each job's cgroup is found (its memory) and
    counts no CPU time, so its processes' is summed: a gets 1,300 × 12/40 = 390 J, b none, and the
    samples name RAPL. Before, the cgroup was found, its CPU time never read, and both got nothing."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(Path(__file__).parents[3] / "fake_nvml" / "scenarios"
                                                 / "four_gpus.json"))
    node = f"node-{tmp_path.name}"
    proc, cgroups, root = tmp_path / "proc", tmp_path / "cgroup", tmp_path / "powercap"
    jobs = {"a": f"{tmp_path.name[-6:]}1", "b": f"{tmp_path.name[-6:]}2"}
    numbers = {"a": 8201, "b": 8202}
    registrations = tmp_path / "jobs"
    for gpu, (what, job) in enumerate(jobs.items()):
        write_registration(registrations, Registration(cluster="default", job_id=job, node=node,
                                                       started_us=wire.now_us(), gpus=(gpu,), user="ana",
                                                       slurm_job_id=numbers[what]))
        memory = cgroups / "memory" / "slurm" / "uid_1000" / f"job_{numbers[what]}"
        write(memory / "memory.usage_in_bytes", "1048576\n")
        write(memory / "memory.limit_in_bytes", "2147483648\n")
    (cgroups / "cpu,cpuacct").mkdir()  # mounted, with no job folders: Slurm constrains memory only
    settings = AgentSettings(url=live_collector.url, token=live_collector.token, node=node,
                             spool_dir=str(tmp_path / "spool"), data_dir=str(tmp_path / "data"), batch_age_s=0.2)
    powercap(root, 1_000_000, 50_000, RANGE_UJ - 200_000_000, 70_000, 5)
    energy = NodeEnergy(RaplCounters(str(root)), "cores", proc_root=str(proc))
    sampler = NvmlSampler(library_path=str(fake_library))
    shipper = Shipper(settings)
    daemon = NodeDaemon(settings, sampler, shipper, registration_dir=str(registrations), proc_root=str(proc),
                        cgroup_root=str(cgroups), energy=energy)
    try:
        proc_stat(proc, 100.0, 100.0)
        job_process(proc, 3001, numbers["a"], 50.0)
        job_process(proc, 3002, numbers["b"], 1.0)
        daemon.tick()
        powercap(root, 601_000_000, 100_050_000, 300_000_000, 100_070_000, 9_999_000_000)
        proc_stat(proc, 120.0, 120.0)
        job_process(proc, 3001, numbers["a"], 62.0)
        daemon.tick()
        assert shipper.flush(10.0)
    finally:
        shipper.shutdown(2.0)
        sampler.close()
    rows = {job: db.execute("SELECT cpu_time_s, mem_used, energy_j, power_source FROM host_samples "
                            "WHERE job_id = %s ORDER BY ts", (job,)).fetchall() for job in jobs.values()}
    assert [row[:2] for row in rows[jobs["a"]]] == [(50.0, 1048576), (62.0, 1048576)]
    assert rows[jobs["a"]][1][2] == pytest.approx(390.0, rel=1e-6)
    assert rows[jobs["b"]][1][2:] == (0.0, "rapl")
    assert rows[jobs["a"]][1][3] == "rapl"
