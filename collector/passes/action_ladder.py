"""Which step of a policy's ladder is due for one job, decided from facts alone (no database, no Slurm).

A ladder belongs to one open finding: when the job goes back to work the finding resolves, and a
later idle spell opens a new finding, so a job that recovers starts its ladder again. Steps come one
per pass and in order (first warning, second warning, action): a collector that was down for hours
warns twice before it acts, and one that restarts finds the steps it took in the actions table and
neither repeats nor skips one.

What a policy covers and exempts is read only from what the site controls (docs/security.md, boundary
11): the batch flag and time limit, partition, QOS, user and job id Slurm gave the prolog; accounts only
where the settings say accounting enforces them. The job's name and comment are its user's word, and
an exemption by them is recorded as such.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from jobsight.collector.config.actions import Policy
from jobsight.rules.rule_names import HUNG_RANK, IDLE_ALLOCATION, LOW_UTILISATION

WARN: Final = "warn"
WARN_AGAIN: Final = "warn_again"
ACT: Final = "act"
EXEMPT: Final = "exempt"
LADDER: Final = (WARN, WARN_AGAIN, ACT)


@dataclass(frozen=True)
class JobFacts:
    """What Slurm's records say of a running job (the prolog's registration); ``batch`` is ``False``
    for a job without a batch script (``salloc``, ``srun --pty``), ``None`` where it was not known;
    ``time_limit_s`` ``None``: no limit, or not known."""

    job_id: str
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    name: str | None = None
    comment: str | None = None
    batch: bool | None = None
    time_limit_s: int | None = None


@dataclass(frozen=True)
class Candidate:
    """An open finding of a running job, with when its GPUs last sent a sample (``None``: never) and
    when they went idle by the finding's evidence (``None``: it does not say; the finding's opening
    stands in)."""

    finding_id: int
    rule: str
    opened_at: dt.datetime
    last_sample_at: dt.datetime | None
    job: JobFacts
    idle_since: dt.datetime | None = None

    @property
    def idle_from(self) -> dt.datetime:
        """When the waste began: the evidence's ``idle_since``, else the finding's opening."""
        return self.idle_since if self.idle_since is not None else self.opened_at


def idle_since(evidence: Mapping[str, Any] | None, opened_at: dt.datetime) -> dt.datetime | None:
    """``evidence["idle_since"]`` (epoch seconds, set by the health rules) as a time; ``None`` when absent,
    not a finite number, or after the finding opened (the GPUs were idle before it could open)."""
    value = (evidence or {}).get("idle_since")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if value > opened_at.timestamp():
        return None
    return dt.datetime.fromtimestamp(value, dt.UTC)


def covers(policy: Policy, candidate: Candidate) -> bool:
    """Whether the policy's rule and filters take in this finding's job."""
    job = candidate.job
    filters = ((policy.partitions, job.partition), (policy.accounts, job.account), (policy.qos, job.qos),
               (policy.users, job.user))
    return candidate.rule == policy.rule and all(not wanted or value in wanted for wanted, value in filters)


def _interactive(policy: Policy, job: JobFacts) -> str | None:
    """Why the job counts as interactive, or ``None``. Anyone can start a job without a batch script, or
    name a batch job like an app: each holds only for a time limit within the policy's cap, so no job
    is exempt for longer than the site allows an interactive session."""
    limit = job.time_limit_s
    if not policy.exempt_interactive or limit is None or limit > policy.interactive_max_time_limit_s:
        return None
    if job.batch is False:
        return "interactive (no batch script)"
    if job.partition is not None and job.partition in policy.interactive_partitions:
        return f"interactive partition {job.partition}"
    if job.name is not None and job.name in policy.interactive_names:
        return "interactive app (by its name, the user's word)"
    return None


def exemption(policy: Policy, job: JobFacts) -> str | None:
    """Why the policy leaves this job alone (the first reason that holds); ``None`` when it does not.
    Accounts count only where the settings say accounting enforces them (else no policy lists one)."""
    interactive = _interactive(policy, job)
    if interactive is not None:
        return interactive
    if job.user is not None and job.user in policy.exempt_users:
        return "exempt user"
    if job.account is not None and job.account in policy.exempt_accounts:
        return "exempt account"
    if job.job_id in policy.exempt_jobs:
        return "exempt job"
    if policy.exempt_comment and job.comment and policy.exempt_comment in job.comment:
        return "exempt by its comment (the user's word)"
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


WHAT: Final = {IDLE_ALLOCATION: "GPUs idle", LOW_UTILISATION: "GPUs under-used", HUNG_RANK: "a rank hung"}
"""What each rule a policy acts on says of a job, in the reason Slurm shows."""


def reason(policy: Policy, candidate: Candidate, now: dt.datetime) -> str:
    """The reason written where the user sees it: ``jobsight: GPUs idle 2.5 h (policy gpu-idle)``, counted
    from when the GPUs went idle (:attr:`Candidate.idle_from`), not from when the finding opened."""
    elapsed = (now - candidate.idle_from).total_seconds()
    return f"jobsight: {WHAT.get(candidate.rule, candidate.rule)} {duration_words(elapsed)} (policy {policy.name})"
