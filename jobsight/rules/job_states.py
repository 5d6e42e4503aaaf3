"""A job's state as Slurm names it, and which of two end states the collector keeps.

A job's end is heard from several places, in any order: each node's epilog (environment plus
``squeue --json``), the training process's own ``job_ended``, reconciliation with ``sacct`` or
``squeue`` (collector/passes/reconcile.py), the silent-node rule that marks a job ``lost`` and, for a run
outside Slurm, its processes' own end events or their silence (``silent``). They do
not all know as much: a training process that died of SIGTERM only knows it exited 143, where the
epilog or ``sacct`` knows Slurm cancelled it at its time limit. So the collector keeps the **most
specific** state it has heard: a later record replaces the stored state only when it ranks at least
as high (:data:`SPECIFICITY`), whatever order the records arrive in. An equal rank replaces, so a
later ``failed`` brings its exit code.

``running`` is not an end state; a job's ``job_started`` sets it, ``job_ended`` never does.
"""

from __future__ import annotations

from typing import Final

RUNNING: Final = "running"

COMPLETED: Final = "completed"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
TIMEOUT: Final = "timeout"
OUT_OF_MEMORY: Final = "out_of_memory"
NODE_FAIL: Final = "node_fail"
PREEMPTED: Final = "preempted"
REQUEUED: Final = "requeued"
LOST: Final = "lost"
"""Not a Slurm state: nothing said how the job ended, and all its nodes went silent past its time
limit plus a grace period (collector/passes/reconcile.py)."""
SILENT: Final = "silent"
"""Not a Slurm state: a run outside Slurm (no Slurm job id, no prolog) whose processes stopped sending
without saying they ended (SIGKILL, the OOM killer, a lost node) and stayed silent for ``silent_after_s``
(collector/passes/local_runs.py)."""

SPECIFICITY: Final[dict[str, int]] = {
    # Nothing known: any word from Slurm replaces it.
    LOST: 0,
    SILENT: 0,
    # What an exit code alone says (the training process, or an epilog that heard nothing more).
    COMPLETED: 1,
    FAILED: 2,
    # Someone ended it: scancel. Ranks below Slurm's own causes, which also end jobs by signal.
    CANCELLED: 3,
    # Slurm ended it, and says why.
    REQUEUED: 4,
    TIMEOUT: 5,
    OUT_OF_MEMORY: 5,
    PREEMPTED: 5,
    NODE_FAIL: 5,
}
"""Each end state's rank: a state replaces a stored one of lower or equal rank, never a higher one."""

END_STATES: Final[tuple[str, ...]] = (COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED,
                                       REQUEUED, LOST, SILENT)
"""Every end state, in the order lists and filters show them."""

# Slurm's JobState names (squeue, scontrol, sacct) → ours. Slurm states without a line here
# (PENDING, RUNNING, COMPLETING, SUSPENDED, ...) are not ends.
_FROM_SLURM: Final[dict[str, str]] = {
    "COMPLETED": COMPLETED,
    "FAILED": FAILED,
    "CANCELLED": CANCELLED,
    "TIMEOUT": TIMEOUT,
    "DEADLINE": TIMEOUT,  # ended at its --deadline: a time limit too
    "OUT_OF_MEMORY": OUT_OF_MEMORY,
    "NODE_FAIL": NODE_FAIL,
    "BOOT_FAIL": NODE_FAIL,  # its node never came up
    "PREEMPTED": PREEMPTED,
    "REQUEUED": REQUEUED,
    "REQUEUE_FED": REQUEUED,
    "REQUEUE_HOLD": REQUEUED,
}


def from_slurm(name: str) -> str | None:
    """Slurm's ``CANCELLED``, ``CANCELLED by 1000`` (sacct), ``TIMEOUT``, or our own ``timeout`` → ours;
    ``None`` for a state that is not an end (``RUNNING``, ``COMPLETING``, ``PENDING``) or unknown."""
    word = name.strip().split(" ", 1)[0].rstrip("+").upper()
    if word.lower() in SPECIFICITY:
        return word.lower()
    return _FROM_SLURM.get(word)


def is_end_state(state: str | None) -> bool:
    return state in SPECIFICITY


def more_specific(stored: str | None, heard: str) -> str:
    """The state to keep when ``heard`` arrives and ``stored`` is what the job has
    (``None`` or ``running``: nothing ended yet, so ``heard`` wins)."""
    if stored not in SPECIFICITY:
        return heard
    return heard if SPECIFICITY.get(heard, -1) >= SPECIFICITY[stored] else stored


def rank_sql(expression: str) -> str:
    """SQL for :data:`SPECIFICITY` of ``expression`` (a column or a parameter); -1 for ``running``,
    NULL or anything else, so an update can keep the most specific state in one statement."""
    # A searched CASE: Citus deparses a simple one (CASE $1 WHEN ...) over a parameter wrongly.
    whens = " ".join(f"WHEN ({expression}) = '{state}' THEN {rank}" for state, rank in SPECIFICITY.items())
    return f"(CASE {whens} ELSE -1 END)"


def slurm_name(state: str | None) -> str:
    """How Slurm prints it: ``timeout`` → ``TIMEOUT``, ``out_of_memory`` → ``OUT_OF_MEMORY``."""
    return (state or "unknown").upper()


def describe(state: str | None, exit_code: int | None) -> str:
    """``FAILED (exit code 3)``, ``TIMEOUT (signal 15)``, ``COMPLETED (exit code 0)``, ``RUNNING``:
    a state with what its exit code says; codes above 128 from a signal read as the signal."""
    name = slurm_name(state)
    if state in (None, RUNNING) or exit_code is None:
        return name
    if exit_code > 128 and state != COMPLETED:
        return f"{name} (signal {exit_code - 128})"
    return f"{name} (exit code {exit_code})"
