"""The node's energy beside its GPUs, tick by tick, and each job's share of it.

The daemon calls :meth:`NodeEnergy.tick` once per tick with the GPUs' power and every job's CPU time;
it answers each job's joules since the job's previous tick (:mod:`jobsight.agent.node.power.energy_split`),
which go out in the job's ``host_sample`` with the source and the split named
(``energy_j``, ``power_source``, ``energy_split``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from jobsight.agent.node.power.energy_split import SPLIT_NAMES, CpuTimes, JobCpu, read_cpu_times, split
from jobsight.agent.node.power.reader import BackgroundPowerReader


class PowerSource(Protocol):
    """A node power source as the tick sees it."""

    @property
    def name(self) -> str:
        """The wire's name: ``rapl``, ``ipmi`` or ``redfish``."""
        ...

    def energy_since_last(self, gpu_watts: float | None, now: float) -> float | None:
        """Joules the node used besides its GPUs since the previous call (``now``: monotonic
        seconds; ``gpu_watts``: the GPUs' power this tick, ``None`` when NVML could not say); ``None``
        when this interval has none."""
        ...

    def close(self) -> None:
        """Stop what the source runs in the background (a BMC's reader); nothing for RAPL."""
        ...


class BmcPower:
    """A BMC's whole-node watts (read in the background) less the GPUs', over the time between calls."""

    includes_gpus: Final = True

    def __init__(self, reader: BackgroundPowerReader, max_age_s: float) -> None:
        self.name = reader.name
        self.reader = reader
        self.max_age_s = max_age_s
        self._previous: float | None = None

    def energy_since_last(self, gpu_watts: float | None, now: float) -> float | None:
        before, self._previous = self._previous, now
        reading = self.reader.latest(self.max_age_s)
        if reading is None or before is None or now <= before or gpu_watts is None:
            return None
        # A BMC reads the wall socket and NVML the board: a node idling at the GPUs' readings'
        # error can read below them; what is beside the GPUs is then nothing, never negative.
        return max(reading.watts - gpu_watts, 0.0) * (now - before)

    def close(self) -> None:
        self.reader.stop()


class NodeEnergy:
    """One node's source and split, with what the previous tick read."""

    def __init__(self, source: PowerSource, idle: str, *, proc_root: str = "/proc",
                 cpu_times: Callable[[str], CpuTimes | None] = read_cpu_times) -> None:
        self.source = source
        self.idle = idle
        self.split_name = SPLIT_NAMES[idle]
        self.proc_root = proc_root
        self._cpu_times = cpu_times
        self._cpu: CpuTimes | None = None
        self._jobs: dict[str, float] = {}

    def tick(self, gpu_watts: float | None, now: float, jobs: dict[str, tuple[float | None, int | None]]
             ) -> dict[str, float]:
        """Each job's joules since the previous tick, from ``jobs``' CPU time so far and cores. A job
        first seen this tick, or whose CPU time is unknown, gets none; so does every job when the
        source or ``/proc/stat`` had no figure for the interval."""
        energy = self.source.energy_since_last(gpu_watts, now)
        cpu, before = self._cpu_times(self.proc_root), self._cpu
        self._cpu = cpu
        measured: dict[str, JobCpu] = {}
        for job, (cpu_time_s, cores) in jobs.items():
            previous = self._jobs.pop(job, None)
            if cpu_time_s is None:
                continue
            if previous is not None and cpu_time_s >= previous:
                measured[job] = JobCpu(cpu_time_s - previous, cores)
            self._jobs[job] = cpu_time_s
        for gone in [j for j in self._jobs if j not in jobs]:
            del self._jobs[gone]
        if energy is None or cpu is None or before is None or not measured:
            return {}
        return split(energy, cpu.busy_s - before.busy_s, cpu.total_s - before.total_s, cpu.cores, measured, self.idle)

    def close(self) -> None:
        self.source.close()
