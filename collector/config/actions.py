"""Settings of the actions pass (``collector/passes/actions.py``): what a site does about waste.

From ``JOBSIGHT_ACTIONS_*`` variables (lists as JSON) and the ``[actions]`` table of the
``JOBSIGHT_CONFIG`` file; a bad value stops the collector with a message naming it. A policy is a
ladder on one health rule: a warning at ``warn_after_s``, a second at ``warn_again_after_s``, then
its ``action`` at ``act_after_s``, counted from when the rule's finding opened. Every policy is a dry
run until the site sets ``dry_run = false``: a dry run records each step it would have taken.

A policy chooses and exempts jobs only by what the site controls: partition, QOS, users and job ids
listed, accounts only where ``accounts_enforced`` says Slurm's accounting enforces associations (else
a job's account is whatever its user typed at submission, and a policy that lists accounts is
refused at start-up). The interactive exemption holds only up to ``interactive_max_time_limit_s``;
a job's name and comment (``interactive_names``, ``exempt_comment``) are its user's word.

```toml
[actions]
max_actions_per_hour = 5
accounts_enforced = true   # AccountingStorageEnforce=associations: users cannot pick any account
[[actions.policies]]
name = "gpu-idle"
rule = "idle_allocation"
partitions = ["gpu"]
warn_after_s = 1800
warn_again_after_s = 3600
act_after_s = 7200
action = "cancel"
dry_run = false
exempt_interactive = true
exempt_accounts = ["ondemand-demo"]
```
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message
from jobsight.rules.rule_names import ActedOnRule

_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Policy(BaseModel):
    """One rule's ladder for the jobs it covers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Names the policy in the actions table, on the job's page and in the reason Slurm shows."""
    rule: ActedOnRule
    """One of :data:`jobsight.rules.rule_names.ACTED_ON_RULES`."""
    warn_after_s: float = Field(gt=0)
    """The first warning, this long after the finding opened."""
    warn_again_after_s: float = Field(gt=0)
    """The second warning."""
    act_after_s: float = Field(gt=0)
    """The action."""
    action: Literal["cancel", "requeue", "notify-only"] = "notify-only"
    dry_run: bool = True
    """Record every step, act on none (the default until the site has watched it for a while)."""
    partitions: list[str] = Field(default_factory=list)
    """Only jobs of these partitions; empty: every partition."""
    accounts: list[str] = Field(default_factory=list)
    qos: list[str] = Field(default_factory=list)
    users: list[str] = Field(default_factory=list)
    exempt_interactive: bool = True
    """Leave alone jobs Slurm runs without a batch script (``salloc``, ``srun --pty``), and jobs of
    ``interactive_partitions`` or named as in ``interactive_names`` (Open OnDemand's apps), each only
    when its time limit is at most ``interactive_max_time_limit_s``."""
    interactive_max_time_limit_s: float = Field(8 * 3600, gt=0)
    """The longest time limit an interactive job is exempt with: anyone can start a job without a batch
    script (``salloc --no-shell`` then ``srun``), so "interactive" holds a job's GPUs idle only as long as
    this. A job without a time limit is never exempt as interactive."""
    interactive_partitions: list[str] = Field(default_factory=list)
    interactive_names: list[str] = Field(default_factory=list)
    """Job names (exact) of interactive apps, e.g. ``sys/dashboard/sys/jupyter``: the user's word (any
    batch job can be named so), bounded by ``interactive_max_time_limit_s`` as the rest."""
    exempt_users: list[str] = Field(default_factory=list)
    exempt_accounts: list[str] = Field(default_factory=list)
    exempt_jobs: list[str] = Field(default_factory=list)
    exempt_comment: str | None = None
    """A job whose Slurm comment contains this text is left alone (a site's opt-out word): the user's
    word, as any user can write it in their job's comment."""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _POLICY_NAME.match(value):
            raise ValueError("a policy name is 1-64 letters, digits, '_', '.' or '-'")
        return value

    @model_validator(mode="after")
    def _steps_in_order(self) -> Policy:
        if not self.warn_after_s < self.warn_again_after_s < self.act_after_s:
            raise ValueError("warn_after_s < warn_again_after_s < act_after_s must hold")
        return self


class ActionSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_ACTIONS_", extra="ignore")
    toml_table: ClassVar[str] = "actions"

    accounts_enforced: bool = False
    """Whether Slurm's accounting enforces associations here (``AccountingStorageEnforce`` with
    ``associations``), so a job's account is one its user is allowed: only then may a policy choose or
    exempt jobs by ``accounts``/``exempt_accounts``. Declared before ``policies``, which it checks."""
    policies: list[Policy] = Field(default_factory=list)
    """The site's policies; none: the pass idles."""
    interval_s: float = Field(60.0, ge=0, le=86400)
    """Seconds between passes; 0 turns acting off."""
    max_actions_per_hour: int = Field(5, ge=0, le=10_000)
    """Cancellations and requeues across the cluster in any hour, at most: past it a step is recorded
    as held back (a stuck collector must not cancel half the machine)."""
    stale_after_s: float = Field(300.0, gt=0)
    """A job none of whose GPUs has a sample this recent is not acted on: a telemetry gap is not idleness."""
    clusters: list[str] = Field(default_factory=list)
    """The jobsight clusters whose jobs the Slurm on this host runs (its ``scancel`` takes a job number,
    which each cluster has its own of); empty: the one cluster the running jobs are from. With jobs of
    several clusters running and this empty, the pass acts on none and says so."""
    scancel: str = "scancel"
    scontrol: str = "scontrol"
    squeue: str = "squeue"
    """Reads a job's ``AdminComment`` before jobsight's reason is added to it."""
    command_timeout_s: float = Field(15.0, gt=0, le=600)

    @field_validator("policies")
    @classmethod
    def _unique_names(cls, policies: list[Policy]) -> list[Policy]:
        names = [policy.name for policy in policies]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"two policies are named {', '.join(twice)}")
        return policies

    @field_validator("policies")
    @classmethod
    def _accounts_only_where_enforced(cls, policies: list[Policy], info: ValidationInfo) -> list[Policy]:
        # Refused rather than ignored: an ignored `accounts` filter would widen the policy to every job.
        if info.data.get("accounts_enforced"):
            return policies
        for policy in policies:
            listed = [name for name in ("accounts", "exempt_accounts") if getattr(policy, name)]
            if listed:
                raise ValueError(
                    f"policy {policy.name} lists {' and '.join(listed)}, but accounts_enforced is false: without "
                    "AccountingStorageEnforce=associations a job's account is its user's choice at submission; "
                    "set accounts_enforced = true (JOBSIGHT_ACTIONS_ACCOUNTS_ENFORCED) if Slurm enforces it, "
                    "or choose the jobs by partition, QOS or user")
        return policies


def load_action_settings(**overrides: Any) -> ActionSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return ActionSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("actions", "JOBSIGHT_ACTIONS_", exc)) from exc
