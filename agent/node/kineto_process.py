"""Which job a process that asked the daemon belongs to, from what its user cannot rewrite.

A process's environment is its user's to set: ``JOBSIGHT_JOB_ID=43`` in a process of job 42 would
pose as another of the user's jobs. Its cgroup is not: Slurm puts every task into
``job_<id>`` under a cgroup that only root may move processes out of (cgroup v2, v1 alike)::

    0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0          v2 (also "<node>_slurmstepd.scope")
    4:memory:/slurm/uid_1000/job_42/step_0/task_0                        v1 (also "/slurm_<node>/...")

The job number is read at those fixed depths only: below ``step_*`` a job may make cgroups of its
own (``.../user/job_43``), and those must not count. Every Slurm line of the file must name the
same job. Only a process in no Slurm cgroup at all (work outside Slurm) is taken at its
environment's word, as before.

An array task's cgroup names its own Slurm id (``SLURM_JOB_ID``), while jobsight registers it
as ``<array job>_<task>``: the registration's ``slurm_job_id`` joins the two.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from jobsight.agent.node.registrations import Registration
from jobsight.protocol.slurm_ids import job_id_from_env

MAX_ENVIRON_BYTES: Final = 256 * 1024
MAX_CGROUP_BYTES: Final = 64 * 1024
RANK_VARIABLES: Final = ("RANK", "SLURM_PROCID", "LOCAL_RANK")
MAX_RANK_DIGITS: Final = 9

# [0-9], never \d: str patterns match every Unicode digit ("²", "٣"), which int() then refuses.
_V2_JOB = re.compile(r"^/(?:system\.slice/)?(?:[^/]+_)?slurmstepd\.scope/job_([0-9]{1,12})(?:/|$)")
_V1_JOB = re.compile(r"^/slurm(?:_[^/]+)?/uid_[0-9]{1,10}/job_([0-9]{1,12})(?:/|$)")
_SLURM_PART = re.compile(r"^(?:slurm(?:_.*)?|(?:.+_)?slurmstepd\.scope)$")
_DIGITS = re.compile(rf"^[0-9]{{1,{MAX_RANK_DIGITS}}}$")


@dataclass(frozen=True)
class CgroupPlace:
    """Where a process sits: in Slurm at all, and in which job (``None``: none, or ambiguous)."""

    in_slurm: bool
    slurm_job_id: int | None = None


@dataclass(frozen=True)
class ProcessJob:
    """A process's job (``None`` with the reason when it has none the daemon may serve)."""

    job: str | None
    refusal: str = ""


def read_environ(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    """A process's environment (bounded); empty when it cannot be read."""
    raw = _read_proc(pid, "environ", MAX_ENVIRON_BYTES, proc_root)
    env = {}
    for entry in (raw or b"").split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def process_uid(pid: int, proc_root: str = "/proc") -> int | None:
    try:
        return os.stat(os.path.join(proc_root, str(pid))).st_uid
    except OSError:
        return None


def rank_of(env: Mapping[str, str]) -> int:
    """The process's rank from the first rank variable made of ASCII digits only; 0 when none is."""
    for name in RANK_VARIABLES:
        value = env.get(name, "")
        if _DIGITS.match(value):
            return int(value)
    return 0


def parse_cgroup(text: str) -> CgroupPlace:
    """The Slurm job of a ``/proc/<pid>/cgroup`` text (see the module's doc)."""
    jobs: set[int] = set()
    in_slurm = False
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        match = _V2_JOB.match(path) or _V1_JOB.match(path)
        if match:
            jobs.add(int(match.group(1)))
            in_slurm = True
        elif any(_SLURM_PART.match(part) for part in path.split("/")):
            in_slurm = True  # slurmstepd's own cgroup, or one a job made: in Slurm, in no job we trust
    if len(jobs) == 1:
        return CgroupPlace(True, jobs.pop())
    return CgroupPlace(in_slurm)


def slurm_cgroup(pid: int, proc_root: str = "/proc") -> CgroupPlace | None:
    """Where ``pid`` sits; ``None`` when its cgroup file cannot be read (it has gone)."""
    raw = _read_proc(pid, "cgroup", MAX_CGROUP_BYTES, proc_root)
    return None if raw is None else parse_cgroup(raw.decode("utf-8", "replace"))


def registration_for_slurm_id(registrations: Iterable[Registration], slurm_job_id: int) -> Registration | None:
    """The registration of Slurm's job ``slurm_job_id``: the one that says so, else (a prolog
    that did not say) the one registered under that very number."""
    fallback = None
    for registration in registrations:
        if registration.slurm_job_id == slurm_job_id:
            return registration
        if registration.slurm_job_id is None and registration.job_id == str(slurm_job_id):
            fallback = registration
    return fallback


def job_of_process(pid: int, env: Mapping[str, str], registrations: Mapping[str, Registration],
                   proc_root: str = "/proc") -> ProcessJob:
    """The registered job ``pid`` belongs to: by its Slurm cgroup, or, for a process outside
    Slurm, by ``env`` (its environment)."""
    place = slurm_cgroup(pid, proc_root)
    if place is None:
        return ProcessJob(None, "process gone")
    if place.slurm_job_id is not None:
        registration = registration_for_slurm_id(registrations.values(), place.slurm_job_id)
        return ProcessJob(registration.job_id) if registration else ProcessJob(None, "job not registered here")
    if place.in_slurm:
        return ProcessJob(None, "in no single Slurm job's cgroup")
    try:
        job = env.get("JOBSIGHT_JOB_ID") or job_id_from_env(dict(env))
    except ValueError:
        return ProcessJob(None, "not a job's process")
    return ProcessJob(job) if job in registrations else ProcessJob(None, "job not registered here")


def _read_proc(pid: int, name: str, most: int, proc_root: str) -> bytes | None:
    try:
        with open(os.path.join(proc_root, str(pid), name), "rb") as handle:
            return handle.read(most)
    except OSError:
        return None
