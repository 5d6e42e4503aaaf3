"""``jobsight agent``: the node daemon.

Every interval it takes one NVML snapshot of every GPU on the node, attributes
each GPU to its job (:mod:`jobsight.agent.node.attribution`), reads each registered job's host
CPU and memory (:mod:`jobsight.agent.node.host`), and hands the records to the shipper. A GPU
that works for no job is not shipped. A process on a GPU that no job was given, outside every job
registered here, is reported as what it is: a ``gpu_unallocated_use`` record (no job; for the
admins), once per process at most every :data:`UNALLOCATED_REPORT_EVERY_S` per GPU while the use
lasts, never under a job id the process claims. The critical Xid errors NVML
reported since the last tick become ``gpu_event`` records of the jobs their GPU works for this
tick (the jobs of any of its rows: a GPU in MIG mode works for its instances' jobs).

The schedule does not drift (``next += interval``); a tick that overruns skips
the ticks it missed rather than bunching them. Start-up, signals and the drain at
exit are the command's (:mod:`jobsight.commands.agent`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from jobsight.agent.node.attribution import Attribution, Attributor, uid_of_pid
from jobsight.agent.node.gpu.nvml import NvmlUnavailable
from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.agent.node.host import HostReading, HostSampler
from jobsight.agent.node.power.node_energy import NodeEnergy
from jobsight.agent.node.registrations import Registration, read_registrations
from jobsight.agent.node.slurm_cgroups import pids_by_job
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.protocol import wire

log = logging.getLogger("jobsight.agent.daemon")

MIN_INTERVAL_S: Final = 0.5
UNALLOCATED_REPORT_EVERY_S: Final = 60.0
"""A GPU used outside any job is reported at most once in this long while the use lasts."""
MAX_REPORTED_PROCESSES: Final = 16
"""Processes reported per GPU and report, at most (the first by pid)."""


@dataclass
class TickResult:
    """What one tick did (for tests, benchmarks and the debug log)."""

    gpu_records: int = 0
    event_records: int = 0
    host_records: int = 0
    unattributed: int = 0
    """GPU rows that worked for no job and were not shipped."""
    unallocated_records: int = 0
    """``gpu_unallocated_use`` records queued: processes on GPUs no job was given."""
    nvml_ok: bool = True


class NodeDaemon:
    """The sampling loop, with every input a parameter (CONTRIBUTING rule 8)."""

    def __init__(
        self,
        settings: AgentSettings,
        sampler: NvmlSampler,
        shipper: Shipper,
        *,
        interval_s: float | None = None,
        registration_dir: str | None = None,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        clock: Callable[[], float] = time.monotonic,
        energy: NodeEnergy | None = None,
    ) -> None:
        self.settings = settings
        self.energy = energy
        """The node's power beside its GPUs, split across jobs; ``None``: the GPUs' energy alone."""
        self.sampler = sampler
        self.shipper = shipper
        self.interval_s = max(MIN_INTERVAL_S, interval_s if interval_s is not None else settings.sample_interval_s)
        self.registration_dir = registration_dir or settings.registration_dir
        self.proc_root = proc_root
        self._clock = clock
        self._attributor = Attributor(proc_root)
        self._host = HostSampler(proc_root, cgroup_root, clock)
        self._nvml_failing = False
        self._warned_nodes: set[str] = set()
        self._unallocated_reported: dict[tuple[int, str], float] = {}
        """When each GPU (index, UUID) used outside any job was last reported, while the use lasts."""

    def tick(self) -> TickResult:
        """One snapshot of every GPU and every registered job, queued for shipping."""
        result = TickResult()
        ts = wire.now_us()
        node = self.settings.node
        registrations = read_registrations(self.registration_dir)
        self._check_nodes(registrations)
        try:
            readings = self.sampler.sample()
        except NvmlUnavailable as exc:
            # The driver may be reloading (an upgrade): keep the host samples, retry next tick.
            if not self._nvml_failing:
                log.warning("jobsight agent: NVML unavailable, GPU samples paused: %s", exc)
            self._nvml_failing = True
            readings = []
            result.nvml_ok = False
        else:
            if self._nvml_failing:
                log.info("jobsight agent: NVML is back")
            self._nvml_failing = False
        jobs_of_gpu: dict[int, list[str]] = {}
        attributed = self._attributor.attribute(readings, registrations)
        for reading, jobs, _outside in attributed:
            if not jobs:
                result.unattributed += 1
                continue
            of_gpu = jobs_of_gpu.setdefault(reading.gpu_index, [])
            of_gpu += [job for job in jobs if job not in of_gpu]
            fields = reading.to_record()
            for job in jobs:
                self.shipper.enqueue({"kind": "gpu_sample", "job": job, "ts": ts, "node": node, **fields})
                result.gpu_records += 1
        if result.nvml_ok:
            result.event_records = self._gpu_events(jobs_of_gpu, ts, node)
            result.unallocated_records = self._unallocated_uses(attributed, ts, node)
        # Without NVML this tick the GPUs' power is unknown: a BMC's whole-node watts cannot be split from it.
        gpu_watts = _gpu_watts(readings) if result.nvml_ok else None
        result.host_records = self._host_samples(registrations, ts, node, gpu_watts)
        if result.unattributed:
            log.debug("jobsight agent: %d GPU row(s) with no job this tick, not shipped", result.unattributed)
        return result

    def _gpu_events(self, jobs_of_gpu: dict[int, list[str]], ts: int, node: str) -> int:
        """The Xid errors since the last tick, one ``gpu_event`` per event and job of its GPU.
        An event on a GPU without a job has no job to go to: the sampler has logged it."""
        shipped = 0
        for event in self.sampler.events():
            for job in jobs_of_gpu.get(event.gpu_index, ()):
                self.shipper.enqueue({"kind": "gpu_event", "job": job, "ts": ts, "node": node,
                                      "gpu_index": event.gpu_index, "gpu_uuid": event.gpu_uuid,
                                      "event": event.event, "code": event.code})
                shipped += 1
        return shipped

    def _unallocated_uses(self, attributed: list[Attribution], ts: int, node: str) -> int:
        """One ``gpu_unallocated_use`` record per process outside any job on a GPU no job was given,
        for each such GPU not reported in the last :data:`UNALLOCATED_REPORT_EVERY_S`. A GPU whose
        use ended is forgotten, so the next use is reported at once."""
        outside: dict[tuple[int, str], dict[int, int]] = {}
        for attribution in attributed:
            if attribution.outside:
                gpu = (attribution.reading.gpu_index, attribution.reading.gpu_uuid)
                outside.setdefault(gpu, {}).update(attribution.outside)  # a GPU's MIG devices: one report
        self._unallocated_reported = {gpu: at for gpu, at in self._unallocated_reported.items() if gpu in outside}
        now = self._clock()
        queued = 0
        for (index, uuid), processes in sorted(outside.items()):
            last = self._unallocated_reported.get((index, uuid))
            if last is not None and now - last < UNALLOCATED_REPORT_EVERY_S:
                continue
            self._unallocated_reported[(index, uuid)] = now
            pids = sorted(processes)
            log.warning("jobsight agent: GPU %d was given to no job but runs %d process(es) outside any job "
                        "(pids %s); reported as a use outside any job", index, len(pids),
                        ", ".join(map(str, pids[:MAX_REPORTED_PROCESSES])))
            for pid in pids[:MAX_REPORTED_PROCESSES]:
                self.shipper.enqueue({"kind": "gpu_unallocated_use", "ts": ts, "node": node, "gpu_index": index,
                                      "gpu_uuid": uuid, "pid": pid,
                                      "uid": _within(uid_of_pid(pid, self.proc_root), 0, 2**31 - 1),
                                      "mem_used": _within(processes[pid], 1, 2**63 - 1)})
                queued += 1
        return queued

    def _check_nodes(self, registrations: list[Registration]) -> None:
        for registration in registrations:
            if registration.node != self.settings.node and registration.node not in self._warned_nodes:
                self._warned_nodes.add(registration.node)
                log.warning(
                    "jobsight agent: registration of job %s names node %r but this daemon ships as %r; "
                    "set JOBSIGHT_NODE to the Slurm node name",
                    registration.job_id,
                    registration.node,
                    self.settings.node,
                )

    def _host_samples(self, registrations: list[Registration], ts: int, node: str, gpu_watts: float | None) -> int:
        self._host.forget(r.job_id for r in registrations)
        by_job: dict[str, list[int]] | None = None
        readings: dict[str, HostReading] = {}
        for registration in registrations:
            pids: list[int] | None = None
            if not self._host.counts_cpu(registration):  # no cgroup, or one without cpuacct: its processes
                if by_job is None:
                    by_job = pids_by_job(registrations, self.proc_root)  # one scan per tick, only when needed
                pids = by_job.get(registration.job_id, [])
            reading = self._host.sample(registration, pids)
            if reading is not None:
                readings[registration.job_id] = reading
        energy: dict[str, float] = {}
        if self.energy is not None:
            energy = self.energy.tick(gpu_watts, self._clock(), {
                job: (r.cpu_time_s, self._host.cores(job)) for job, r in readings.items()})
        for job, reading in readings.items():
            record = {"kind": "host_sample", "job": job, "ts": ts, "node": node, **reading.to_record()}
            if self.energy is not None and job in energy:
                record.update(energy_j=energy[job], power_source=self.energy.source.name,
                              energy_split=self.energy.split_name)
            self.shipper.enqueue(record)
        return len(readings)

    def close(self) -> None:
        """Stop the node power source's background reader, if it has one."""
        if self.energy is not None:
            self.energy.close()

    def run(self, stop: threading.Event, once: bool = False, before_tick: Callable[[], None] | None = None) -> int:
        """Tick until ``stop`` is set (or once); returns the number of ticks."""
        ticks = 0
        next_at = self._clock()
        while not stop.is_set():
            if before_tick is not None:
                before_tick()
            try:
                self.tick()
            except Exception:  # boundary: one bad tick must not end the daemon
                log.exception("jobsight agent: tick failed")
            ticks += 1
            if once:
                break
            next_at += self.interval_s
            now = self._clock()
            if next_at < now:
                missed = int((now - next_at) // self.interval_s) + 1
                log.debug("jobsight agent: tick overran, skipping %d tick(s)", missed)
                next_at += missed * self.interval_s
            stop.wait(next_at - now)
        return ticks


def _within(value: int | None, least: int, most: int) -> int | None:
    """``value`` when it is from ``least`` to ``most`` (its wire field's bounds), else ``None``: an odd
    reading loses its field, never the record (nor, refused by the collector, the batch)."""
    return value if value is not None and least <= value <= most else None


def _gpu_watts(readings: list[GpuReading]) -> float:
    """The GPUs' power this tick, each GPU once (its MIG instances' rows repeat the board's)."""
    by_gpu: dict[int, float] = {}
    for reading in readings:
        if reading.power_w is not None:
            by_gpu[reading.gpu_index] = max(by_gpu.get(reading.gpu_index, 0.0), reading.power_w)
    return sum(by_gpu.values())
