"""Which job a GPU works for: registrations, cross-checked with the processes on it.

The prolog's registration says which GPUs Slurm gave a job; that is the
allocation the job is accounted for, so it decides. NVML's list of compute
processes on the GPU is the cross-check: each pid is traced to its job through
``/proc/<pid>/cgroup`` (Slurm's ``job_<id>`` cgroup) or ``/proc/<pid>/environ``
(``SLURM_JOB_ID``). The process evidence

* picks among several registrations that claim one GPU (a stale file left by a
  failed epilog, or a GPU shared through ``shard``/MPS),
* names the job of a GPU that no registration claims (a job that started while
  the prolog failed or before the daemon ran), and
* is logged once when it disagrees with the registration.

The cgroup is asked first because the kernel sets it; the environment is
whatever the job's user put there.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from jobsight.agent.node.gpu_reading import GpuReading
from jobsight.agent.node.registrations import Registration

log = logging.getLogger("jobsight.agent.attribution")

# cgroup v1: /slurm/uid_1000/job_123/step_0/task_0
# cgroup v2: /system.slice/slurmstepd.scope/job_123/step_batch/user/task_0
_CGROUP_JOB = re.compile(r"/job_([0-9][0-9_+]*)(?:/|$)")
_ENV_KEY = b"SLURM_JOB_ID="


def job_from_cgroup(pid: int, proc_root: str = "/proc") -> str | None:
    """The Slurm job whose cgroup holds ``pid``; ``None`` when none does or it cannot be read."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _CGROUP_JOB.search(path)
        if match:
            return match.group(1)
    return None


def job_from_environ(pid: int, proc_root: str = "/proc") -> str | None:
    """``SLURM_JOB_ID`` in the process's environment; ``None`` when unset or unreadable
    (another user's process needs root)."""
    try:
        with open(os.path.join(proc_root, str(pid), "environ"), "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    for entry in data.split(b"\0"):
        if entry.startswith(_ENV_KEY):
            value = entry[len(_ENV_KEY) :].decode("utf-8", "replace").strip()
            return value or None
    return None


def job_of_pid(pid: int, proc_root: str = "/proc") -> str | None:
    """The Slurm job of a process: its cgroup, else its ``SLURM_JOB_ID``; ``None`` when neither says."""
    return job_from_cgroup(pid, proc_root) or job_from_environ(pid, proc_root)


def pids_by_job(proc_root: str = "/proc") -> dict[str, list[int]]:
    """Every process on the node that belongs to a Slurm job, grouped by job id.

    A full scan of ``proc_root``; the daemon calls it only for jobs it cannot
    measure through their cgroup.
    """
    jobs: dict[str, list[int]] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return jobs
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        job = job_of_pid(pid, proc_root)
        if job is not None:
            jobs.setdefault(job, []).append(pid)
    for pids in jobs.values():
        pids.sort()
    return jobs


@dataclass
class Attributor:
    """Maps each GPU reading of a tick to the jobs it is shipped under.

    Keeps a pid → job cache for one tick only (pids are reused) and the set of
    disagreements already logged.
    """

    proc_root: str = "/proc"
    _logged: set[tuple[object, ...]] = field(default_factory=set)
    _cache: dict[int, str | None] = field(default_factory=dict)

    def _job(self, pid: int) -> str | None:
        if pid not in self._cache:
            self._cache[pid] = job_of_pid(pid, self.proc_root)
        return self._cache[pid]

    def _log_once(self, level: int, key: tuple[object, ...], message: str, *args: object) -> None:
        if key not in self._logged:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged.add(key)
            log.log(level, message, *args)

    def process_jobs(self, reading: GpuReading) -> list[str]:
        """Jobs of the processes NVML lists on this GPU (or MIG device), in pid order, distinct."""
        jobs: dict[str, None] = {}
        for pid, _memory in reading.processes:
            job = self._job(pid)
            if job is not None:
                jobs[job] = None
        return list(jobs)

    def jobs_for(self, reading: GpuReading, registrations: Sequence[Registration]) -> list[str]:
        """The jobs this reading belongs to; empty for a GPU that works for no job.

        More than one only for a GPU that several registered jobs share and use (or,
        unregistered, one running processes of several jobs): each sees it.
        """
        claimants = [r.job_id for r in registrations if reading.gpu_index in r.gpus]
        running = self.process_jobs(reading)
        if len(claimants) == 1:
            job = claimants[0]
            others = [j for j in running if j != job]
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
            return [job]
        if claimants:
            using = [j for j in claimants if j in running]
            chosen = using or claimants
            self._log_once(
                logging.INFO,
                ("shared", reading.gpu_index, tuple(claimants), tuple(chosen)),
                "GPU %d is registered to jobs %s; shipping its samples to %s",
                reading.gpu_index,
                ", ".join(claimants),
                ", ".join(chosen),
            )
            return chosen
        if running:
            self._log_once(
                logging.INFO,
                ("unregistered", reading.gpu_index, tuple(running)),
                "GPU %d has no registration; its processes belong to job(s) %s",
                reading.gpu_index,
                ", ".join(running),
            )
        return running

    def attribute(
        self, readings: Iterable[GpuReading], registrations: Sequence[Registration]
    ) -> list[tuple[GpuReading, list[str]]]:
        """Each reading with its jobs (see :meth:`jobs_for`), for one tick."""
        self._cache = {}
        try:
            return [(reading, self.jobs_for(reading, registrations)) for reading in readings]
        finally:
            self._cache = {}
