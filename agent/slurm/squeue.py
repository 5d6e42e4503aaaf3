"""What Slurm says about one job, from its structured answer ``squeue --json -j <id> --states=all``.

The root hooks once read ``scontrol show job -o``, a line of ``Key=value`` pairs in which the
user's own ``JobName=`` (and comment, work directory, output paths) may hold spaces and
``Key=value`` text of its own: a job named ``x HetJobId=4242 TimeLimit=365-00:00:00`` made the
prolog mint a token for job 4242. JSON has no such ambiguity: every field is its own value, and a
name is only ever a name. See ``docs/security.md``.

``squeue --json`` answers on Slurm 21.08 and later (22.05 is Debian 12's), for pending, running,
completing and recently ended jobs (``MinJobAge``), one job with ``-j``; both of its shapes are
read by :mod:`jobsight.protocol.slurm_json`. An ended job only with ``--states=all`` since 23.02:
without it, 26.05's ``squeue --json`` drops every job that is not pending, running, suspended,
staging out or completing, ``-j`` or not (``src/squeue/print.c``: ``squeue_filter_jobs_for_json`` →
``_filter_job``); 22.05 answers every job it remembers either way and takes the option too.

squeue runs with ``PATH`` and slurmd's ``SLURM_CONF`` only (:func:`slurm_env`): a Slurm whose
``slurm.conf`` is not where its commands were built to look (configless, or installed under a prefix
and configured elsewhere) is found by what slurmd says, never by luck. Which ``squeue``:
:func:`find_squeue`.

Standard library only (the hooks run on every node with the agent extra at most).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
from collections.abc import Mapping
from pathlib import PurePosixPath
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


def slurm_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a Slurm command of the hooks runs with: ``PATH``, and ``SLURM_CONF`` as slurmd
    gave it to the hook (an absolute path; anything else is left out, and the command looks where it
    was built to). Nothing else of the hook's environment (``SQUEUE_FORMAT``, ``SLURM_TIME_FORMAT``,
    ...) can change what Slurm prints."""
    out = {"PATH": "/usr/bin:/bin"}
    conf = env.get("SLURM_CONF", "")
    if conf.startswith("/"):
        out["SLURM_CONF"] = conf
    return out


def _root_command(path: str) -> bool:
    """Whether ``path`` is a regular executable file owned by root that group and others cannot write:
    root runs it (the wrappers' rule for ``hooks.env``)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return (stat.S_ISREG(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022
            and bool(info.st_mode & 0o100))


def find_squeue(env: Mapping[str, str]) -> str:
    """The ``squeue`` the hooks ask: ``JOBSIGHT_SQUEUE`` (hooks.env) when set; else the one beside
    slurmd's ``SLURM_CONF`` in an installation prefix (``<prefix>/etc/slurm.conf`` or
    ``<prefix>/etc/slurm/slurm.conf`` → ``<prefix>/bin/squeue``, a Slurm built with ``--prefix``), when
    that is root's (:func:`_root_command`); else :data:`SQUEUE`. A ``slurm.conf`` under ``/etc`` names
    no prefix: that is the system's Slurm, :data:`SQUEUE`."""
    chosen = env.get("JOBSIGHT_SQUEUE")
    if chosen:
        return chosen
    conf = PurePosixPath(env.get("SLURM_CONF") or "/")
    etc = conf.parent.parent if conf.parent.name == "slurm" else conf.parent
    if conf.is_absolute() and etc.name == "etc" and etc.parent != PurePosixPath("/"):
        beside = str(etc.parent / "bin" / "squeue")
        if _root_command(beside):
            return beside
    return SQUEUE


def ask_squeue(job: str, squeue: str, timeout_s: float, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """:func:`job_fields` of one ``squeue --json -j <job> --states=all`` run with a timeout; ``{}``
    (logged) when it cannot be run, times out or prints no JSON. ``job`` is Slurm's own id; ``env`` the
    hook's, for its ``SLURM_CONF`` (:func:`slurm_env`)."""
    if not job.isdigit():  # never empty: squeue without -j lists every job
        return {}
    try:
        # --states=all: 26.05 answers an ended job only with it (see the module's docstring); after the
        # id, so that `-j <id>` stays where the tests' stand-in squeue reads it.
        result = subprocess.run([squeue, "--json", "-j", job, "--states=all"], capture_output=True,
                                timeout=timeout_s, check=False, env=slurm_env(env or {}),
                                stdin=subprocess.DEVNULL)
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
