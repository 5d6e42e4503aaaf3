"""Where the Slurm under test keeps its commands, and what differs between the versions tested.

The real-Slurm tests run on Debian's Slurm 22.05 (commands in ``/usr/bin``, configuration in
``/etc/slurm``) and on Slurm 26.05 built from source into ``/opt/slurm-26.05``
(tests/slurm/build_slurm.sh; configuration in ``/opt/slurm-26.05/etc``). ``JOBSIGHT_TEST_SLURM_PREFIX``
names the prefix in effect (default ``/usr``); every test takes Slurm's commands from here, never
from a path of its own, and passes the prefix on to ``setup_cluster.sh`` (``SLURM_PREFIX``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Final

from jobsight.agent.slurm.squeue import job_fields
from jobsight.protocol.slurm_json import number

PREFIX_VARIABLE: Final = "JOBSIGHT_TEST_SLURM_PREFIX"
PREFIX: Final = Path(os.environ.get(PREFIX_VARIABLE) or "/usr")


def command(name: str) -> str:
    """The path of Slurm's user command ``name`` (``sbatch``, ``squeue``, ...) under the prefix."""
    return str(PREFIX / "bin" / name)


def daemon(name: str) -> str:
    """The path of Slurm's daemon ``name`` (``slurmctld``, ``slurmd``) under the prefix."""
    return str(PREFIX / "sbin" / name)


SBATCH: Final = command("sbatch")
SALLOC: Final = command("salloc")
SCANCEL: Final = command("scancel")
SCONTROL: Final = command("scontrol")
SQUEUE: Final = command("squeue")
SACCT: Final = command("sacct")
SINFO: Final = command("sinfo")
SLURMCTLD: Final = daemon("slurmctld")
SLURMD: Final = daemon("slurmd")


def setup_environment() -> dict[str, str]:
    """What ``setup_cluster.sh`` and ``teardown_cluster.sh`` are given to act on this Slurm: nothing
    for Debian's (their default), the prefix otherwise."""
    return {} if PREFIX == Path("/usr") else {"SLURM_PREFIX": str(PREFIX)}


def squeue_json(job: str) -> str:
    """``squeue --json`` about Slurm's job ``job`` (its own id), ended ones included: 22.05 answers
    every job it remembers, but 26.05 answers an ended job only with ``--states=all``; both take it.
    Read as UTF-8 with U+FFFD: a hostile test's job name may hold bytes that are not UTF-8."""
    return subprocess.run([SQUEUE, "--json", "--states=all", "-j", job], capture_output=True, encoding="utf-8",
                          errors="replace", timeout=10, env={"PATH": "/usr/bin:/bin"}).stdout


def job_state(job: str) -> tuple[str, str]:
    """``(JobState, ExitCode)`` of Slurm's job ``job`` (its own id) as its structured answer gives them
    (never parsed out of a line that holds the job's name: the hostile tests name jobs
    ``JobState=NODE_FAIL ...``); ``("UNKNOWN", "")`` when Slurm does not know the job.

    ``COMPLETING`` while the job's epilog runs, on both versions: 22.05 says ``"COMPLETING"``, 26.05
    ``["COMPLETED", "COMPLETING"]`` (the end state first), which would end a test's wait before the
    epilog sent the end and while the job still holds the node (the next module finds it in the queue)."""
    try:
        answer = json.loads(squeue_json(job) or "{}")
    except ValueError:
        answer = {}
    fields = job_fields(answer, job)
    if "COMPLETING" in _state_flags(answer, job):
        return "COMPLETING", fields.get("exit_code", "")
    return fields.get("job_state", "UNKNOWN"), fields.get("exit_code", "")


def _state_flags(answer: Any, job: str) -> list[str]:
    """The job's ``job_state`` list (26.05); ``[]`` for 22.05's one string or a job not in the answer."""
    jobs = answer.get("jobs") if isinstance(answer, dict) else None
    for entry in jobs if isinstance(jobs, list) else []:
        if isinstance(entry, dict) and str(number(entry.get("job_id"))) == job:
            flags = entry.get("job_state")
            return [f for f in flags if isinstance(f, str)] if isinstance(flags, list) else []
    return []


def busy_queue(timeout_s: float = 30.0) -> str:
    """Slurm's queue (``squeue -h``) as a test that needs the cluster to itself checks it: ``""`` when
    empty. Jobs only completing (an earlier module's, cancelled, their epilog running) are waited for,
    up to ``timeout_s``; any other job is returned at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = subprocess.run([SQUEUE, "-h", "-o", "%T"], capture_output=True, text=True, timeout=10).stdout.split()
        if not states or set(states) != {"COMPLETING"} or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    # A hostile test's job name may hold bytes that are not UTF-8.
    return subprocess.run([SQUEUE, "-h"], capture_output=True, encoding="utf-8", errors="replace",
                          timeout=10).stdout.strip()
