"""Settings of the reconciliation pass (``collector/passes/reconcile.py``): ``JOBSIGHT_RECONCILE_*``
variables, then the ``[reconcile]`` table of the ``JOBSIGHT_CONFIG`` file. A bad value stops the
collector with a message naming it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message


class ReconcileSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_RECONCILE_", extra="ignore")
    toml_table: ClassVar[str] = "reconcile"

    interval_s: float = Field(60.0, ge=0, le=86400)
    """Seconds between passes; 0 turns reconciliation off (jobs whose end is never heard then stay
    ``running``)."""
    grace_s: float = Field(900.0, ge=0)
    """A job is ``lost`` once this long has passed since its time limit ran out and its nodes have
    sent nothing for this long either. Longer than Slurm's ``KillWait`` and the epilog's own retries,
    so a late epilog usually still comes first."""
    no_limit_silent_s: float = Field(86400.0, ge=0)
    """A running job without a time limit (a workstation run, an ``UNLIMITED`` partition) is ``lost``
    once its nodes have sent nothing for this long; 0: never."""
    silent_after_s: float = Field(600.0, ge=0)
    """A run outside Slurm (no Slurm job id, no prolog) is ended as ``silent`` once it has sent nothing for
    this long while some process of it has not said it ended (killed by SIGKILL or the OOM killer);
    0: never. Longer than the longest stretch a live run sends nothing (no step, log line or sample)."""
    ended_quiet_s: float = Field(10.0, ge=0)
    """A run outside Slurm whose every process said its run ended is ended once nothing of it has arrived
    for this long (the last records in flight, a process that opens another run)."""
    sacct: str = "sacct"
    """The ``sacct`` command (a name looked up on ``PATH``, or a path). Where it is missing or says
    accounting is off, ``squeue`` is asked instead."""
    squeue: str = "squeue"
    """The ``squeue`` command (asked ``--json``: Slurm 21.08 and later); where neither it nor ``sacct``
    exists only the ``lost`` rule applies."""
    command_timeout_s: float = Field(15.0, gt=0, le=600)
    """Each command is killed after this long; the pass goes on as if it had not answered."""
    recheck_ended_s: float = Field(3600.0, ge=0)
    """Jobs that ended this recently, by their epilog, are checked once against ``sacct`` (never
    ``squeue``), which may know a more specific state (``timeout`` where the epilog said
    ``completed``); 0: never."""
    clusters: list[str] = Field(default_factory=list)
    """The jobsight clusters whose jobs the Slurm on this host answers for; empty: all of them. A site
    whose collector serves several Slurm clusters lists the one its ``sacct``/``squeue`` talk to."""
    start_tolerance_s: float = Field(600.0, gt=0)
    """Slurm's record is taken as the job's only if Slurm's start falls between the job's start and
    its last record, give or take this much: a job id Slurm has since reused is not this job."""


def load_reconcile_settings(**overrides: Any) -> ReconcileSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return ReconcileSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("reconcile", "JOBSIGHT_RECONCILE_", exc)) from exc
