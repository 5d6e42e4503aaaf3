"""Which step of a policy's ladder is due for one job, decided from facts alone (no database, no Slurm).

A ladder belongs to one open finding: when the job goes back to work the finding resolves, and a
later idle spell opens a new finding, so a job that recovers starts its ladder again. Steps come one
per pass and in order (first warning, second warning, action): a collector that was down for hours
warns twice before it acts, and one that restarts finds the steps it took in the actions table and
neither repeats nor skips one.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Final

from jobsight.collector.config.actions import Policy

WARN: Final = "warn"
WARN_AGAIN: Final = "warn_again"
ACT: Final = "act"
EXEMPT: Final = "exempt"
LADDER: Final = (WARN, WARN_AGAIN, ACT)


@dataclass(frozen=True)
class JobFacts:
    """What Slurm's records say of a running job (the prolog's registration); ``batch`` is ``False``
    for a job without a batch script (``salloc``, ``srun --pty``), ``None`` where it was not known."""

    job_id: str
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    name: str | None = None
    comment: str | None = None
    batch: bool | None = None


@dataclass(frozen=True)
class Candidate:
    """An open finding of a running job, with when its GPUs last sent a sample (``None``: never)."""

    finding_id: int
    rule: str
    opened_at: dt.datetime
    last_sample_at: dt.datetime | None
    job: JobFacts


def covers(policy: Policy, candidate: Candidate) -> bool:
    """Whether the policy's rule and filters take in this finding's job."""
    job = candidate.job
    filters = ((policy.partitions, job.partition), (policy.accounts, job.account), (policy.qos, job.qos),
               (policy.users, job.user))
    return candidate.rule == policy.rule and all(not wanted or value in wanted for wanted, value in filters)


def exemption(policy: Policy, job: JobFacts) -> str | None:
    """Why the policy leaves this job alone (the first reason that holds); ``None`` when it does not."""
    if policy.exempt_interactive:
        if job.batch is False:
            return "interactive (no batch script)"
        if job.partition is not None and job.partition in policy.interactive_partitions:
            return f"interactive partition {job.partition}"
        if job.name is not None and job.name in policy.interactive_names:
            return "interactive app"
    if job.user is not None and job.user in policy.exempt_users:
        return "exempt user"
    if job.account is not None and job.account in policy.exempt_accounts:
        return "exempt account"
    if job.job_id in policy.exempt_jobs:
        return "exempt job"
    if policy.exempt_comment and job.comment and policy.exempt_comment in job.comment:
        return "exempt by its comment"
    return None


def due_step(policy: Policy, candidate: Candidate, done: set[str], now: dt.datetime,
             stale_after: dt.timedelta) -> str | None:
    """The one step to take now for this finding under this policy, given the steps already ``done``;
    ``None`` when nothing is due. An exempt job gets :data:`EXEMPT` once, then nothing; a job whose
    samples are missing or older than ``stale_after`` gets nothing (a telemetry gap is not idleness)."""
    if not covers(policy, candidate):
        return None
    if exemption(policy, candidate.job) is not None:
        return None if EXEMPT in done else EXEMPT
    if candidate.last_sample_at is None or now - candidate.last_sample_at > stale_after:
        return None
    elapsed = (now - candidate.opened_at).total_seconds()
    for step, after in zip(LADDER, (policy.warn_after_s, policy.warn_again_after_s, policy.act_after_s), strict=True):
        if step not in done:
            return step if elapsed >= after else None
    return None


def duration_words(seconds: float) -> str:
    """``45 min``, ``2 h``, ``2.5 h``: how long, as the reason Slurm shows says it."""
    if seconds < 5400:
        return f"{max(1, round(seconds / 60))} min"
    hours = seconds / 3600
    return f"{hours:.0f} h" if abs(hours - round(hours)) < 0.05 else f"{hours:.1f} h"


WHAT: Final = {"idle_allocation": "GPUs idle", "low_utilisation": "GPUs under-used", "hung_rank": "a rank hung"}


def reason(policy: Policy, candidate: Candidate, now: dt.datetime) -> str:
    """The reason written where the user sees it: ``jobsight: GPUs idle 2 h (policy gpu-idle)``."""
    elapsed = (now - candidate.opened_at).total_seconds()
    return f"jobsight: {WHAT.get(candidate.rule, candidate.rule)} {duration_words(elapsed)} (policy {policy.name})"
