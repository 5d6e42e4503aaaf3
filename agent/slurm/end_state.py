"""How a job ended, as Slurm names it, from what the epilog can see (see ``slurm/README.md``).

Slurm 22.05 gives the epilog no state: only the batch script's exit status
(``SLURM_JOB_EXIT_CODE2``, ``exit:signal``), which reads ``0:0`` for a job cancelled with
``scancel`` or killed at its time limit. Slurm's answer (``squeue --json``) during the epilog says more, but its
``JobState`` is ``COMPLETING`` until every node's epilog is done; the cause is in its other fields:

* ``JobState`` already an end state (an epilog that ran late, or another Slurm): that;
* ``Restarts`` above the run's ``SLURM_JOB_RESTART_COUNT``, or a requeue state: ``REQUEUED``;
* ``Reason``: ``TimeLimit`` → ``TIMEOUT``, ``OutOfMemory`` → ``OUT_OF_MEMORY``,
  ``NodeDown``/``BootFail`` → ``NODE_FAIL``, ``Preempted`` → ``PREEMPTED``;
* ``ExitCode`` with a signal and no reason (``0:15``): ``CANCELLED`` (a job that failed on its
  own has ``Reason=NonZeroExitCode``);
* else the exit status: ``COMPLETED`` for 0, ``FAILED`` otherwise.

The names are Slurm's; the collector maps them to its own (``jobsight/rules/job_states.py``) and keeps
the most specific state any record told it. This module is the standard library only.
"""

from __future__ import annotations

import re
from typing import Final

# Slurm's end states as squeue prints them.
_ENDS: Final = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
_REQUEUES: Final = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# squeue's state_reason (slurm job_state_reason_string) → the end it means.
_REASONS: Final[dict[str, str]] = {
    "TimeLimit": "TIMEOUT",
    "DeadLine": "DEADLINE",
    "OutOfMemory": "OUT_OF_MEMORY",
    "NodeDown": "NODE_FAIL",
    "BootFail": "NODE_FAIL",
    "Preempted": "PREEMPTED",
}


def parse_exit(text: str | None) -> tuple[int, int] | None:
    """Slurm's ``exit:signal`` → ``(exit, signal)``; ``None`` when absent or unreadable."""
    match = re.fullmatch(r"(\d+):(\d+)", (text or "").strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def as_exit_code(pair: tuple[int, int]) -> int:
    """``(exit, signal)`` → one exit code, a signal reading as ``128 + signal`` (a shell's way)."""
    code, signal = pair
    return 128 + signal if signal else code


def end_state(fields: dict[str, str], restart_count: int, env_exit: int | None) -> tuple[str | None, int | None]:
    """``(state, exit_code)`` in Slurm's names from Slurm's answer ``fields``
    (:func:`jobsight.agent.slurm.squeue.ask_squeue`) and the environment's exit code.

    ``state`` is ``None`` when squeue said nothing (not run, timed out, job forgotten): the
    collector then reads the exit code alone. ``exit_code`` prefers the environment's unless it is 0
    and squeue saw a non-zero status (a cancelled job: environment ``0:0``, squeue ``0:15``).
    """
    seen = parse_exit(fields.get("exit_code"))
    exit_code = env_exit
    if seen is not None and not env_exit and as_exit_code(seen):
        exit_code = as_exit_code(seen)
    if not fields.get("job_state"):
        return None, exit_code
    state = fields["job_state"].rstrip("+")
    restarts = fields.get("restarts", "")
    if state in _ENDS:
        return state, exit_code
    if state in _REQUEUES or (restarts.isdigit() and int(restarts) > restart_count):
        return "REQUEUED", exit_code
    reason = _REASONS.get(fields.get("reason", ""))
    if reason:
        return reason, exit_code
    if seen is not None and seen[1] and fields.get("reason", "None") == "None":
        return "CANCELLED", exit_code
    return ("COMPLETED" if not exit_code else "FAILED"), exit_code
