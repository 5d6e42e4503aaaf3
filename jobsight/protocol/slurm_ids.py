"""How jobsight names a Slurm job, from a Slurm environment (a hook's, or a training process's):
shared by the Slurm hooks and the node daemon, which reads a process's environment."""

from __future__ import annotations

import re

SAFE_JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
"""Any job id jobsight takes (match it whole, with ``fullmatch``): Slurm's, a run's outside Slurm
(``local-<host>-<pid>-<start>``), a demo's. Never begins with ``-``, so no id reads as an option."""
SLURM_JOB = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,5})?")
"""The forms of a Slurm job's id as users see it (match it whole): ``1234``, an array task ``1234_7``, a
heterogeneous job's component ``1234+1``. ASCII digits only (``\\d`` takes other scripts' digits)."""


def is_job_id(job: object) -> bool:
    """Whether ``job`` is an id jobsight takes at all (:data:`SAFE_JOB`)."""
    return isinstance(job, str) and SAFE_JOB.fullmatch(job) is not None


def is_slurm_job_id(job: object) -> bool:
    """Whether ``job`` is a Slurm job's id (:data:`SLURM_JOB`): only such an id reaches a Slurm command."""
    return isinstance(job, str) and SLURM_JOB.fullmatch(job) is not None


def ascii_digits(text: str) -> bool:
    """``0``-``9`` only: ``str.isdigit`` also takes ``²`` and other scripts' digits."""
    return text.isascii() and text.isdigit()


def job_id_from_env(env: dict[str, str]) -> str:
    """The job id users see, so that every hook and the task prolog name a job alike:

    * an array task: ``<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>`` (``1234_7``, as ``squeue``
      prints it; its own ``SLURM_JOB_ID`` is another number that users do not see);
    * a heterogeneous job's component: ``SLURM_HET_JOB_ID`` (the leader's id), so all components
      are one job;
    * else ``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``).

    ``ValueError`` when missing or unsafe as a file name.
    """
    array_job, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if ascii_digits(array_job) and ascii_digits(task):
        job = f"{array_job}_{task}"
    else:
        job = env.get("SLURM_HET_JOB_ID") or env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not is_job_id(job):
        raise ValueError(f"SLURM_JOB_ID {job!r} is missing or not a job id")
    return job


def slurm_job_id(env: dict[str, str]) -> str:
    """Slurm's own id of the job (``SLURM_JOB_ID``), which ``squeue -j`` knows it by: an array task's
    own number, not ``N_i``. ``ValueError`` when missing or not a job id."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not is_job_id(job):  # never empty: ``squeue`` without an id lists every job
        raise ValueError(f"SLURM_JOB_ID {job!r} is missing or not a job id")
    return job
