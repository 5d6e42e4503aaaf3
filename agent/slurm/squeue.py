"""What Slurm says about one job, from its structured answer ``squeue --json -j <id>``.

The root hooks once read ``scontrol show job -o``, a line of ``Key=value`` pairs in which the
user's own ``JobName=`` (and comment, work directory, output paths) may hold spaces and
``Key=value`` text of its own: a job named ``x HetJobId=4242 TimeLimit=365-00:00:00`` made the
prolog mint a token for job 4242. JSON has no such ambiguity: every field is its own value, and a
name is only ever a name. See ``docs/security.md``.

``squeue --json`` answers on Slurm 21.08 and later (22.05 is Debian 12's), for pending, running,
completing and recently ended jobs (``MinJobAge``), one job with ``-j``; both of its shapes are
read by :mod:`jobsight.protocol.slurm_json`.

Standard library only (the hooks run on every node with the agent extra at most).
"""

from __future__ import annotations

import json
import logging
import subprocess
from typing import Any, Final

from jobsight.protocol.slurm_json import exit_pair, number, state

log = logging.getLogger("jobsight.slurm")

SQUEUE: Final = "/usr/bin/squeue"
MAX_ANSWER_BYTES: Final = 4 * 1024 * 1024
"""One job's answer is a few kilobytes; a larger one is not read whole."""


def job_fields(answer: Any, job: str) -> dict[str, str]:
    """The fields the hooks use, from a parsed ``squeue --json`` answer, for the job whose own
    ``job_id`` is ``job`` (Slurm's id: an array task's own number). ``{}`` when absent.

    Keys, each only when Slurm gave it: ``time_limit`` (minutes), ``name``, ``job_state``,
    ``reason``, ``exit_code`` (``exit:signal``), ``restarts``, ``array_job_id``,
    ``array_task_id``, ``het_job_id``, ``user_id``, ``batch`` (``true`` for a job with a batch script,
    ``false`` for ``salloc``/``srun --pty``), ``qos``, ``comment``.
    """
    jobs = answer.get("jobs") if isinstance(answer, dict) else None
    if not isinstance(jobs, list) or not job.isdigit():
        return {}
    wanted = int(job)
    found = next((j for j in jobs if isinstance(j, dict) and number(j.get("job_id")) == wanted), None)
    if found is None:
        return {}
    fields: dict[str, str] = {}
    numbers = {"time_limit": "time_limit", "restarts": "restart_cnt", "user_id": "user_id"}
    for key, name in numbers.items():
        count = number(found.get(name))
        if count is not None and count >= 0:
            fields[key] = str(count)
    # 0 means "none" for these ids in every version.
    for key, name in (("array_job_id", "array_job_id"), ("het_job_id", "het_job_id")):
        ident = number(found.get(name))
        if ident:
            fields[key] = str(ident)
    task = number(found.get("array_task_id"))
    if "array_job_id" in fields and task is not None and task >= 0:
        fields["array_task_id"] = str(task)
    base = state(found.get("job_state"))
    if base:
        fields["job_state"] = base
    batch = found.get("batch_flag")
    if isinstance(batch, bool):
        fields["batch"] = "true" if batch else "false"
    for key, name in (("reason", "state_reason"), ("name", "name"), ("qos", "qos"), ("comment", "comment")):
        text = found.get(name)
        if isinstance(text, str) and text:
            fields[key] = text
    pair = exit_pair(found.get("exit_code"))
    if pair is not None:
        fields["exit_code"] = f"{pair[0]}:{pair[1]}"
    return fields


def ask_squeue(job: str, squeue: str, timeout_s: float) -> dict[str, str]:
    """:func:`job_fields` of one ``squeue --json -j <job>`` run with a timeout; ``{}`` (logged)
    when it cannot be run, times out or prints no JSON. ``job`` is Slurm's own id."""
    if not job.isdigit():  # never empty: squeue without -j lists every job
        return {}
    try:
        result = subprocess.run([squeue, "--json", "-j", job], capture_output=True, timeout=timeout_s,
                                check=False, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("job %s: squeue --json failed (%s)", job, exc)
        return {}
    if len(result.stdout) > MAX_ANSWER_BYTES:
        log.warning("job %s: squeue --json printed %d bytes; not read", job, len(result.stdout))
        return {}
    try:
        # A job's name and comment are its user's bytes, not always UTF-8: read as what they are, so
        # one bad byte in a name does not make Slurm's whole answer unreadable.
        answer = json.loads(result.stdout.decode("utf-8", "replace"))
    except ValueError:
        log.warning("job %s: squeue --json printed no JSON (exit %d)", job, result.returncode)
        return {}
    return job_fields(answer, job)
