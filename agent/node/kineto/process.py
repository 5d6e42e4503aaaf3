"""Which job a process that asked the daemon belongs to, from what its user cannot rewrite.

A process's environment is its user's to set: ``JOBSIGHT_JOB_ID=43`` in a process of job 42 would
pose as another of the user's jobs. Its cgroup is not: Slurm puts every task into its job's cgroup
(``job_<id>``, or the job's SLUID on Slurm 26.05's cgroup v2), which only root may move processes out
of. :mod:`jobsight.agent.node.slurm_cgroups` reads it, at Slurm's fixed depths only (below ``step_*``
a job may make cgroups of its own, ``.../user/job_43``, and those must not count), and every Slurm
line of the file must name the same job. Only a process in no Slurm cgroup at all (work outside
Slurm) is taken at its environment's word, as before.

An array task's cgroup names its own Slurm id (``SLURM_JOB_ID``), while jobsight registers it
as ``<array job>_<task>``: the registration's ``slurm_job_id`` joins the two; a SLUID folder is
joined through the registration's ``sluid``, never guessed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from jobsight.agent.node.registrations import Registration
from jobsight.agent.node.slurm_cgroups import read_place, registration_of
from jobsight.protocol.slurm_ids import job_id_from_env

MAX_ENVIRON_BYTES: Final = 256 * 1024
RANK_VARIABLES: Final = ("RANK", "SLURM_PROCID", "LOCAL_RANK")
MAX_RANK_DIGITS: Final = 9

# [0-9], never \d: str patterns match every Unicode digit ("²", "٣"), which int() then refuses.
_DIGITS = re.compile(rf"^[0-9]{{1,{MAX_RANK_DIGITS}}}$")


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


def job_of_process(pid: int, env: Mapping[str, str], registrations: Mapping[str, Registration],
                   proc_root: str = "/proc") -> ProcessJob:
    """The registered job ``pid`` belongs to: by its Slurm cgroup, or, for a process outside
    Slurm, by ``env`` (its environment)."""
    place = read_place(pid, proc_root)
    if place is None:
        return ProcessJob(None, "process gone")
    if place.job is not None:
        registration = registration_of(place.job, registrations.values())
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
