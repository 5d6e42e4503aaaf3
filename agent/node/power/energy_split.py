"""Each job's share of the node's power beside the GPUs, by CPU time.

Over one tick the node used ``E`` joules besides its GPUs (RAPL's packages and DRAM, or the BMC's
whole-node power less the GPUs' own). Over the same tick the node's CPUs had ``T`` seconds of time
(cores × tick), of which ``B`` were busy (``/proc/stat``: all but idle and iowait), and each job's
cgroup used ``c`` CPU seconds (``cpu.stat``, v1's ``cpuacct.usage``; the sum over its processes where its
cgroup counts none: :mod:`jobsight.agent.node.host`). Then:

* the busy part, ``E × B / T``, goes to the jobs by their share of the busy time, ``c / B``: a job
  gets ``E × c / T``. What the jobs did not use of ``B`` (the node's daemons, the kernel) is left
  unassigned;
* the idle part, ``E × (T − B) / T``, is what the node draws while its cores wait: with the site's
  ``idle`` setting ``cores``, each job gets the share its allocated cores are of the node's
  (``cpuset.cpus.effective``), and the cores nobody was given leave theirs unassigned; with
  ``none``, all of it stays unassigned.

The GPUs' own energy is not here: it is each GPU's counter, per job, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

IDLE_SPLITS: Final = ("cores", "none")
SPLIT_NAMES: Final = {"cores": "cpu_time+idle_cores", "none": "cpu_time"}
"""The wire's name of each ``idle`` setting: stored with every figure (``host_sample.energy_split``)."""


@dataclass(frozen=True)
class CpuTimes:
    """The node's CPU time so far in seconds: ``busy`` and ``total`` (idle included), and its cores."""

    busy_s: float
    total_s: float
    cores: int


def read_cpu_times(proc_root: str = "/proc", ticks_per_s: int | None = None) -> CpuTimes | None:
    """The node's CPU times from ``<proc_root>/stat``; ``None`` when it cannot be read."""
    if ticks_per_s is None:
        try:
            ticks_per_s = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            ticks_per_s = 100
    try:
        with open(os.path.join(proc_root, "stat"), encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    first = lines[0].split() if lines else []
    if len(first) < 5 or first[0] != "cpu":
        return None
    try:
        # user nice system idle iowait irq softirq steal (guest and guest_nice are inside user and nice)
        values = [int(v) for v in first[1:9]]
    except ValueError:
        return None
    total = sum(values)
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return CpuTimes((total - idle) / ticks_per_s, total / ticks_per_s, max(cores, 1))


def count_cpus(cpuset: str) -> int | None:
    """The CPUs in a cpuset list (``0-3,8,10-11`` → 7); ``None`` when it is not one."""
    count = 0
    try:
        for part in cpuset.strip().split(","):
            if not part:
                continue
            low, _, high = part.partition("-")
            first = int(low)
            last = int(high) if high else first
            if last < first:
                return None
            count += last - first + 1
    except ValueError:
        return None
    return count or None


@dataclass(frozen=True)
class JobCpu:
    """One job over a tick: CPU seconds it used (``None``: unknown this tick) and its cores (its cgroup's cpuset)."""

    cpu_s: float | None
    cores: int | None


def split(energy_j: float, busy_s: float, total_s: float, node_cores: int, jobs: dict[str, JobCpu],
          idle: str) -> dict[str, float]:
    """Each job's joules of ``energy_j`` (see the module's docstring). Shares never add up to more
    than ``energy_j``: jobs' CPU time above the node's busy time (clocks read a moment apart) is
    scaled down to it, and cores given to more than one job share the idle part they carry."""
    if total_s <= 0 or energy_j <= 0:
        return dict.fromkeys(jobs, 0.0)
    busy_s = min(max(busy_s, 0.0), total_s)
    used = sum(max(j.cpu_s or 0.0, 0.0) for j in jobs.values())
    scale = busy_s / used if used > busy_s else 1.0
    idle_j = energy_j * (total_s - busy_s) / total_s
    given = sum(j.cores or 0 for j in jobs.values())
    per_core = idle_j / max(node_cores, given, 1)  # cores given twice over (oversubscribed) share the idle
    shares = {}
    for job, cpu in jobs.items():
        share = energy_j * max(cpu.cpu_s or 0.0, 0.0) * scale / total_s
        if idle == "cores" and cpu.cores:
            share += per_core * cpu.cores
        shares[job] = share
    return shares
