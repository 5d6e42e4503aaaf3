"""What the job page's header says about who ran a job and where, when Slurm did not say.

A Slurm job's user and partition come from its prolog (``jobs.user_name``, ``jobs.partition``).
A run outside Slurm has no prolog: its user is the training process's owner, which the agent
sends with the run's metadata (``attrs.process``), and a partition does not apply to it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

UNKNOWN: Final = "unknown"
NOT_APPLICABLE: Final = "n/a"
"""A partition outside Slurm: not unknown, there is none."""


def _process(job: Mapping[str, Any]) -> Mapping[str, Any]:
    attrs = job.get("attrs")
    process = attrs.get("process") if isinstance(attrs, Mapping) else None
    return process if isinstance(process, Mapping) else {}


def outside_slurm(job: Mapping[str, Any]) -> bool:
    """True when the job is known to run outside Slurm: a local job id, or a training process that
    said Slurm did not start it, and no prolog registered it (which would name a user)."""
    if job.get("user_name"):
        return False
    return str(job.get("job_id") or "").startswith("local-") or _process(job).get("slurm") is False


def user(job: Mapping[str, Any]) -> str:
    """Slurm's user, else the training process's owner, else :data:`UNKNOWN`."""
    owner = _process(job).get("user")
    return str(job.get("user_name") or (owner if isinstance(owner, str) and owner else UNKNOWN))


def partition(job: Mapping[str, Any]) -> str:
    """Slurm's partition; :data:`NOT_APPLICABLE` outside Slurm; else :data:`UNKNOWN` (a Slurm job
    whose prolog has not been heard from)."""
    if job.get("partition"):
        return str(job["partition"])
    return NOT_APPLICABLE if outside_slurm(job) else UNKNOWN
