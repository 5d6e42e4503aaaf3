"""Which job a GPU works for: registrations, cross-checked with the processes on it.

The prolog's registration says which GPUs Slurm gave a job; that is the allocation the job is
accounted for, so it decides. NVML's list of compute processes on the GPU is the cross-check: each
pid is traced to its job through ``/proc/<pid>/cgroup`` (Slurm's job cgroup, ``job_<id>`` or the job's
SLUID, which the kernel keeps and no process can choose; read by :mod:`jobsight.agent.node.slurm_cgroups`).
The process evidence

* picks among several registrations that claim one GPU (a stale file left by a failed epilog, or a
  GPU shared through ``shard``/MPS),
* names the job of a GPU that no registration claims only when that job is registered on this node
  (a registration whose GPU list was incomplete), and
* is logged once when it disagrees with the registration.

A process's environment is never asked: any process can set ``SLURM_JOB_ID`` (to another user's
job, or to ``--user=alice``). A process on a GPU that no job was given, outside every job registered
here, is a use of the GPU outside any job: it is returned as such (:attr:`Attribution.outside`) for
the node daemon to report to the admins, never shipped under a job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.agent.node.registrations import Registration
from jobsight.agent.node.slurm_cgroups import JobFolder, read_place, registration_of

log = logging.getLogger("jobsight.agent.attribution")


def job_from_cgroup(pid: int, proc_root: str = "/proc") -> JobFolder | None:
    """The Slurm job whose cgroup holds ``pid`` (its number or SLUID); ``None`` when none does, the
    lines name several, or the file cannot be read."""
    place = read_place(pid, proc_root)
    return place.job if place is not None else None


def uid_of_pid(pid: int, proc_root: str = "/proc") -> int | None:
    """The real uid of ``pid`` (``/proc/<pid>/status``); ``None`` when it cannot be read (it exited)."""
    try:
        with open(os.path.join(proc_root, str(pid), "status"), encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _registered_as(cgroup_job: JobFolder, registrations: Sequence[Registration]) -> str | None:
    """The id of the job registered on this node whose cgroup folder this is; ``None`` when no
    registration here holds it."""
    registration = registration_of(cgroup_job, registrations)
    return registration.job_id if registration is not None else None


class Attribution(NamedTuple):
    """One GPU reading of a tick, with the jobs it is shipped under."""

    reading: GpuReading
    jobs: list[str]
    """Empty for a GPU that works for no job: not shipped."""
    outside: list[tuple[int, int]]
    """``(pid, used GPU memory in bytes)`` of each process on a GPU that no job was given and that no
    job registered on this node holds: a use of the GPU outside any job. Empty on a GPU a
    registration names (what runs there is the allocation's business)."""


@dataclass
class Attributor:
    """Maps each GPU reading of a tick to the jobs it is shipped under.

    Keeps a pid → job cache for one tick only (pids are reused) and the set of
    disagreements already logged.
    """

    proc_root: str = "/proc"
    _logged: set[tuple[object, ...]] = field(default_factory=set)
    _cache: dict[int, JobFolder | None] = field(default_factory=dict)

    def _job(self, pid: int) -> JobFolder | None:
        if pid not in self._cache:
            self._cache[pid] = job_from_cgroup(pid, self.proc_root)
        return self._cache[pid]

    def _log_once(self, level: int, key: tuple[object, ...], message: str, *args: object) -> None:
        if key not in self._logged:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged.add(key)
            log.log(level, message, *args)

    def process_jobs(self, reading: GpuReading, registrations: Sequence[Registration] = ()) -> list[str]:
        """Jobs whose cgroups hold the processes NVML lists on this GPU (or MIG device), in pid order,
        distinct: each as its registration names it (an array task's cgroup names Slurm's own number
        of it, registered as ``<array job>_<task>``), else as its cgroup does."""
        jobs: dict[str, None] = {}
        for pid, _memory in reading.processes:
            job = self._job(pid)
            if job is not None:
                jobs[_registered_as(job, registrations) or str(job)] = None
        return list(jobs)

    def jobs_for(self, reading: GpuReading, registrations: Sequence[Registration]) -> list[str]:
        """The jobs this reading belongs to; empty for a GPU that works for no job (see :meth:`attribute_one`)."""
        return self.attribute_one(reading, registrations).jobs

    def attribute_one(self, reading: GpuReading, registrations: Sequence[Registration]) -> Attribution:
        """This reading's jobs, and the processes on it outside any job.

        More than one job only for a GPU that several registered jobs share and use (or, unclaimed,
        one running processes of several jobs registered here): each sees it.
        """
        claimants = [r.job_id for r in registrations if reading.gpu_index in r.gpus]
        if len(claimants) == 1:
            job = claimants[0]
            others = [j for j in self.process_jobs(reading, registrations) if j != job]
            if others:
                self._log_once(
                    logging.WARNING,
                    ("mismatch", reading.gpu_index, job, tuple(others)),
                    "GPU %d is registered to job %s but runs processes of job(s) %s; keeping job %s",
                    reading.gpu_index,
                    job,
                    ", ".join(others),
                    job,
                )
            return Attribution(reading, [job], [])
        if claimants:
            running = self.process_jobs(reading, registrations)
            chosen = [j for j in claimants if j in running] or claimants
            self._log_once(
                logging.INFO,
                ("shared", reading.gpu_index, tuple(claimants), tuple(chosen)),
                "GPU %d is registered to jobs %s; shipping its samples to %s",
                reading.gpu_index,
                ", ".join(claimants),
                ", ".join(chosen),
            )
            return Attribution(reading, chosen, [])
        return self._unclaimed(reading, registrations)

    def _unclaimed(self, reading: GpuReading, registrations: Sequence[Registration]) -> Attribution:
        """A GPU no registration names: the jobs registered here whose cgroups hold its processes,
        and the processes outside all of them."""
        jobs: dict[str, None] = {}
        outside: list[tuple[int, int]] = []
        for pid, memory in reading.processes:
            cgroup_job = self._job(pid)
            job = _registered_as(cgroup_job, registrations) if cgroup_job is not None else None
            if job is not None:
                jobs[job] = None
            else:
                outside.append((pid, memory))
        if jobs:
            self._log_once(
                logging.INFO,
                ("unregistered", reading.gpu_index, tuple(jobs)),
                "GPU %d has no registration; its processes are in the cgroups of job(s) %s, registered here",
                reading.gpu_index,
                ", ".join(jobs),
            )
        return Attribution(reading, list(jobs), outside)

    def attribute(self, readings: Iterable[GpuReading], registrations: Sequence[Registration]) -> list[Attribution]:
        """Each reading with its jobs and outside processes (see :meth:`attribute_one`), for one tick."""
        self._cache = {}
        try:
            return [self.attribute_one(reading, registrations) for reading in readings]
        finally:
            self._cache = {}
