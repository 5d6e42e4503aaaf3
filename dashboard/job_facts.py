"""What the job page's header says about who ran a job and where, when Slurm did not say.

A Slurm job's user and partition come from its prolog (``jobs.user_name``, ``jobs.partition``).
A run outside Slurm has no prolog: its user is the training process's owner, which the agent
sends with the run's metadata (``attrs.process``), and a partition does not apply to it.
The rules live once in :mod:`jobsight.rules.display_text`, which the report uses too."""

from __future__ import annotations

from jobsight.rules.display_text import NOT_APPLICABLE, UNKNOWN, outside_slurm, partition, user

__all__ = ["NOT_APPLICABLE", "UNKNOWN", "outside_slurm", "partition", "user"]
