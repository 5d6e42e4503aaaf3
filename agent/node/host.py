"""Per-job host CPU and memory, for ``host_sample`` records.

The job's Slurm cgroup is read when there is one, found by :mod:`jobsight.agent.node.slurm_cgroups`
at Slurm's own paths (``job_<id>`` or the job's SLUID, one slurmd or several): cgroup v2
(``cpu.stat`` and ``memory.current``/``memory.max`` in the job's folder) or v1 (``cpuacct.usage`` in
the job's ``cpuacct`` folder, ``memory.usage_in_bytes``/``memory.limit_in_bytes`` in its ``memory``
folder). Without one (no cgroup plugin, a container) the job's processes are summed from
``<proc_root>/<pid>/stat`` and ``status``: CPU time of the live processes and their resident memory
(shared pages counted once per process, so an over-estimate), with no limit. A v1 cgroup without a
``cpuacct`` folder (cgroup.conf constraining memory only, ``jobacct_gather/none``) gives the memory;
the CPU time then comes from the job's processes, never lost (:attr:`HostReading.cpu_source`).

All roots and the clock are parameters so tests point them at fixture trees
(CONTRIBUTING rule 8).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from jobsight.agent.node.power.energy_split import count_cpus
from jobsight.agent.node.registrations import Registration
from jobsight.agent.node.slurm_cgroups import JobDirs, find_job_dirs, folders_of

CPU_UTIL_MAX = 100_000.0
"""The wire's bound on ``cpu_util`` (percent of one CPU)."""

log = logging.getLogger("jobsight.agent.host")

# cgroup v1 reports "no limit" as the largest page-aligned signed 64-bit value.
_V1_NO_LIMIT: Final = 2**62
# A job without a cgroup is looked for again after this long, not every tick
# (the search lists the cgroup tree's slices); slurmstepd may create it after the prolog.
_ABSENT_RETRY_S: Final = 30.0


@dataclass(frozen=True)
class HostReading:
    """One job's host usage at one tick. ``None`` means it could not be measured."""

    cpu_time_s: float | None
    """CPU seconds the job has used (cgroup), or its live processes have (``/proc``)."""
    cpu_util: float | None
    """Percent of one CPU since the previous reading (200 = two cores busy); ``None``
    on the first reading of a job or when the CPU time went backwards (a process ended)."""
    mem_used: int | None
    """Bytes: the cgroup's charge (page cache included), or the processes' resident sets."""
    mem_limit: int | None
    """Bytes; ``None`` when the job has no memory limit or it is not known."""
    source: str
    """Where the memory came from: ``cgroup2``, ``cgroup1`` or ``proc``; not a wire field."""
    cpu_source: str | None = None
    """Where ``cpu_time_s`` came from: ``cgroup2``, ``cgroup1`` or ``proc`` (the job's live processes,
    where its cgroup counts no CPU time); ``None`` with no CPU time. Not a wire field."""

    def to_record(self) -> dict[str, Any]:
        """The wire fields of a ``host_sample`` record; the caller adds kind, job, ts, node."""
        return {
            "cpu_util": self.cpu_util,
            "cpu_time_s": self.cpu_time_s,
            "mem_used": self.mem_used,
            "mem_limit": self.mem_limit,
        }


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _counts_cpu(found: JobDirs) -> bool:
    return found.version == 2 or found.of("cpuacct") is not None


class HostSampler:
    """Reads per-job CPU and memory; keeps each job's previous CPU time for ``cpu_util``."""

    def __init__(
        self,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self._clock = clock
        self._previous: dict[str, tuple[float, float, str | None]] = {}
        self._paths: dict[str, JobDirs] = {}
        try:
            self._ticks_per_s = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            self._ticks_per_s = 100
        self._absent_until: dict[str, float] = {}
        self._cores: dict[str, int] = {}

    # -- cgroups -----------------------------------------------------------------

    def find_cgroup(self, registration: Registration) -> JobDirs | None:
        """The job's cgroup folders (:func:`~jobsight.agent.node.slurm_cgroups.find_job_dirs`), or ``None``.

        Looked for again every :data:`_ABSENT_RETRY_S` while absent: slurmstepd may make it after the prolog.
        """
        job = registration.job_id
        cached = self._paths.get(job)
        if cached is not None and cached.exist():
            return cached
        now = self._clock()
        if cached is None and now < self._absent_until.get(job, -1.0):
            return None
        found = find_job_dirs(self.cgroup_root, folders_of(registration), registration.node)
        if found is None:
            self._paths.pop(job, None)
            self._absent_until[job] = now + _ABSENT_RETRY_S
        else:
            self._paths[job] = found
        return found

    def counts_cpu(self, registration: Registration) -> bool:
        """Whether the job's cgroup counts its CPU time; if not, :meth:`sample` wants its processes."""
        found = self.find_cgroup(registration)
        return found is not None and _counts_cpu(found)

    def _from_cgroup2(self, path: str) -> tuple[float | None, int | None, int | None]:
        cpu: float | None = None
        stat = _read_text(os.path.join(path, "cpu.stat"))
        if stat is not None:
            for line in stat.splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    try:
                        cpu = int(value) / 1e6
                    except ValueError:
                        pass
                    break
        used = _read_int(os.path.join(path, "memory.current"))
        limit_text = _read_text(os.path.join(path, "memory.max"))
        limit: int | None = None
        if limit_text is not None and limit_text.strip() != "max":
            try:
                limit = int(limit_text.strip())
            except ValueError:
                limit = None
        return cpu, used, limit

    def _from_cgroup1(self, cpu_dir: str | None, memory_dir: str | None) -> tuple[float | None, int | None, int | None]:
        usage_ns = _read_int(os.path.join(cpu_dir, "cpuacct.usage")) if cpu_dir else None
        # In whole microseconds, as cgroup v2 counts: the packed tier keeps such seconds as integers.
        cpu = usage_ns // 1000 / 1e6 if usage_ns is not None else None
        used = _read_int(os.path.join(memory_dir, "memory.usage_in_bytes")) if memory_dir else None
        limit = _read_int(os.path.join(memory_dir, "memory.limit_in_bytes")) if memory_dir else None
        if limit is not None and limit >= _V1_NO_LIMIT:
            limit = None
        return cpu, used, limit

    def cores(self, job: str) -> int | None:
        """The CPUs Slurm gave the job on this node (its cgroup's cpuset); ``None`` when unknown
        (no cgroup, no cpuset controller): the energy split then gives it no share of idle power."""
        if (known := self._cores.get(job)) is not None:
            return known
        found = self._paths.get(job)
        if found is None:
            return None
        directory = found.of("cpuset")
        name = "cpuset.cpus.effective" if found.version == 2 else "cpuset.cpus"
        text = _read_text(os.path.join(directory, name)) if directory is not None else None
        count = count_cpus(text) if text is not None else None
        if count is not None:
            self._cores[job] = count  # a job's cpuset is set once, at its start
        return count

    # -- /proc --------------------------------------------------------------------

    def _from_proc(self, pids: Iterable[int]) -> tuple[float | None, int | None]:
        ticks = 0
        rss = 0
        seen = False
        for pid in pids:
            stat = _read_text(os.path.join(self.proc_root, str(pid), "stat"))
            if stat is None:
                continue  # ended since it was listed
            try:
                # Fields after the last ")" are fixed; utime and stime are 14 and 15.
                after = stat.rsplit(")", 1)[1].split()
                ticks += int(after[11]) + int(after[12])
            except (IndexError, ValueError):
                continue
            seen = True
            status = _read_text(os.path.join(self.proc_root, str(pid), "status"))
            for line in (status or "").splitlines():
                if line.startswith("VmRSS:"):
                    try:
                        rss += int(line.split()[1]) * 1024
                    except (IndexError, ValueError):
                        pass
                    break
        if not seen:
            return None, None
        return ticks / self._ticks_per_s, rss

    # -- reading --------------------------------------------------------------------

    def sample(self, registration: Registration, pids: Iterable[int] | None = None) -> HostReading | None:
        """The job's usage now: its cgroup, else the sum over ``pids``; the CPU time from ``pids`` too
        where the cgroup counts none (:meth:`counts_cpu`).

        ``None`` when there is neither a cgroup nor a live pid to measure.
        """
        job = registration.job_id
        now = self._clock()
        found = self.find_cgroup(registration)
        if found is not None:
            source = f"cgroup{found.version}"
            if found.version == 2:
                cpu, used, limit = self._from_cgroup2(found.of("") or "")
            else:
                cpu, used, limit = self._from_cgroup1(found.of("cpuacct"), found.of("memory"))
            cpu_source = source if cpu is not None else None
            if cpu is None and pids is not None and not _counts_cpu(found):
                cpu, _rss = self._from_proc(pids)
                cpu_source = "proc" if cpu is not None else None
        elif pids is not None:
            source = cpu_source = "proc"
            cpu, used = self._from_proc(pids)
            limit = None
            if cpu is None:
                self._previous.pop(job, None)
                return None
        else:
            return None
        return HostReading(cpu_time_s=cpu, cpu_util=self._util(job, now, cpu, cpu_source), mem_used=used,
                           mem_limit=limit, source=source, cpu_source=cpu_source)

    def _util(self, job: str, now: float, cpu: float | None, cpu_source: str | None) -> float | None:
        """Percent of one CPU since the job's previous reading; ``None`` on the first, after the CPU
        time went backwards, or when it came from elsewhere last time (a cgroup found late counts
        what the processes that ended had used: no utilisation from that jump)."""
        if cpu is None:
            return None
        previous = self._previous.get(job)
        self._previous[job] = (now, cpu, cpu_source)
        if previous is None or previous[2] != cpu_source:
            return None
        elapsed = now - previous[0]
        spent = cpu - previous[1]
        if elapsed <= 0 or spent < 0:
            return None
        # Two readings very close together can overshoot; the wire's cap is 1000 busy cores.
        # Hundredths of a percent: finer is below what two readings a tick apart can
        # tell, and the packed tier keeps such values as integers (a few bytes, not 4).
        return round(min(100.0 * spent / elapsed, CPU_UTIL_MAX), 2)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the state of every job not in ``keep`` (jobs that ended)."""
        wanted = set(keep)
        for job in [j for j in self._previous if j not in wanted]:
            del self._previous[job]
        for job in [j for j in self._paths if j not in wanted]:
            del self._paths[job]
        for job in [j for j in self._absent_until if j not in wanted]:
            del self._absent_until[job]
        for job in [j for j in self._cores if j not in wanted]:
            del self._cores[job]
