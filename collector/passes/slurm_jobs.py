"""What Slurm itself says about jobs, from ``sacct`` (slurmdbd's accounting) or ``squeue --json``
(slurmctld's memory, ``MinJobAge`` after a job ends), for the reconciliation pass. Only fields no
user writes are read: ``sacct``'s chosen columns, ``squeue``'s JSON values (never a job's name).

Each command runs with a timeout and ``SLURM_TIME_FORMAT=%s`` (times as epoch seconds, whatever the
host's time zone). A command that is missing, times out, exits non-zero (``sacct`` on a cluster
without accounting says "Slurm accounting storage is disabled") or prints nothing usable is *no
answer*: :class:`SlurmCommandError`, which the caller turns into a log line.

Job ids are the ones users see and jobsight stores: ``1234``, an array task ``1234_7``; the
components of a heterogeneous job (``1234+0``, ``1234+1``) answer for ``1234`` together.

Every command that names a job is a function here, and each checks its ids with
:func:`~jobsight.protocol.slurm_ids.is_slurm_job_id` before anything runs (:class:`NotASlurmJobId`
otherwise) and passes them where no id can read as an option: after ``--`` (``scancel -- 1234``,
``scontrol -- requeue 1234``), or inside one argument (``--jobs=1234``, ``JobId=1234``). A stored id
``--user=alice`` once made ``scancel --user=alice``, every job of alice's (docs/security.md, boundary 11).
The runner itself (:func:`_run`) is private, so no caller can name a job without the check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jobsight.protocol.slurm_ids import is_slurm_job_id
from jobsight.protocol.slurm_json import exit_pair, number, state
from jobsight.rules import job_states

SACCT_CHUNK: Final = 200
"""Job ids per ``sacct -j`` call (its command line stays short)."""
_SACCT_FIELDS: Final = "JobID,State,ExitCode,Start,End"
MAX_ADMIN_COMMENT: Final = 1024
"""Characters of a job's ``AdminComment`` jobsight writes at most: the site's text and its reason."""


class SlurmCommandError(RuntimeError):
    """A Slurm command gave no answer; the message says which and why."""


class NotASlurmJobId(SlurmCommandError):
    """A job id that is not one of Slurm's forms: no command was run with it."""


def checked_job_ids(job_ids: Sequence[str]) -> list[str]:
    """``job_ids`` when every one is a Slurm job id (``1234``, ``1234_7``, ``1234+1``); else
    :class:`NotASlurmJobId` naming the first that is not, and no command runs. Never empty: a
    command given no id answers for every job."""
    for job in job_ids:
        if not is_slurm_job_id(job):
            raise NotASlurmJobId(f"{job!r} is not a Slurm job id: no Slurm command was run with it")
    if not job_ids:
        raise NotASlurmJobId("no job id: no Slurm command was run")
    return list(job_ids)


@dataclass(frozen=True)
class SlurmRecord:
    """One job as Slurm describes it."""

    job_id: str
    slurm_state: str
    """Slurm's word: ``COMPLETED``, ``CANCELLED``, ``RUNNING``, ``PENDING``, ..."""
    exit_code: int | None
    """``exit:signal`` read as the epilog reads it: the exit status, or ``128 + signal``."""
    start: float | None
    """Epoch seconds; ``None`` when Slurm has none (pending)."""
    end: float | None

    @property
    def end_state(self) -> str | None:
        """Our end state, or ``None`` while the job is not over (running, pending, completing)."""
        return job_states.from_slurm(self.slurm_state)


def exit_code(text: str) -> int | None:
    """``3:0`` → 3, ``0:15`` → 143 (killed by signal 15), as the epilog reads ``SLURM_JOB_EXIT_CODE2``."""
    match = re.fullmatch(r"\s*(\d+):(\d+)\s*", text)
    if match is None:
        return None
    code, signal = int(match.group(1)), int(match.group(2))
    return 128 + signal if signal else code


def _epoch(text: str) -> float | None:
    """An epoch time under ``SLURM_TIME_FORMAT=%s``; ``Unknown``, ``None``, ``N/A`` → ``None``."""
    text = text.strip()
    return float(text) if text.isdigit() and int(text) > 0 else None


def _merge(records: Iterable[SlurmRecord]) -> dict[str, SlurmRecord]:
    """One record per job id: a heterogeneous job's components make one, with its most specific end
    (a component still running makes the whole job still running), earliest start, latest end."""
    out: dict[str, SlurmRecord] = {}
    for record in records:
        seen = out.get(record.job_id)
        if seen is None:
            out[record.job_id] = record
            continue
        if seen.end_state is None or record.end_state is None:
            state, code = (seen.slurm_state, seen.exit_code) if seen.end_state is None else (
                record.slurm_state, record.exit_code)
        elif job_states.more_specific(seen.end_state, record.end_state) == seen.end_state:
            state, code = seen.slurm_state, seen.exit_code
        else:
            state, code = record.slurm_state, record.exit_code
        starts = [t for t in (seen.start, record.start) if t is not None]
        ends = [t for t in (seen.end, record.end) if t is not None]
        out[record.job_id] = SlurmRecord(record.job_id, state, code, min(starts, default=None),
                                         max(ends, default=None))
    return out


def _public_id(raw: str) -> str:
    """``1234+1`` (a heterogeneous component) → ``1234``; ``1234_7`` stays."""
    return raw.split("+", 1)[0]


def parse_sacct(text: str) -> dict[str, SlurmRecord]:
    """``sacct --parsable2 --noheader -o JobID,State,ExitCode,Start,End`` output, by job id."""
    records = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 5 or not parts[0] or "[" in parts[0]:  # 1234_[8-10]: tasks not started yet
            continue
        records.append(SlurmRecord(_public_id(parts[0]), parts[1], exit_code(parts[2]), _epoch(parts[3]),
                                   _epoch(parts[4])))
    return _merge(records)


def _json_exit(value: Any) -> int | None:
    """``exit_code`` as the epilog reads it: the exit status, or ``128 + signal``."""
    pair = exit_pair(value)
    if pair is None:
        return None
    return 128 + pair[1] if pair[1] else pair[0]


def _public_json_id(job: Mapping[str, Any]) -> str | None:
    """The id users see of one ``squeue --json`` job: ``1234_7`` for an array task, the leader's id for a
    heterogeneous job's component, else its own; ``None`` without a job id."""
    own = number(job.get("job_id"))
    if own is None:
        return None
    array, task, het = (number(job.get(k)) for k in ("array_job_id", "array_task_id", "het_job_id"))
    return f"{array}_{task}" if array and task is not None and task >= 0 else str(het) if het else str(own)


def _json_record(job: Mapping[str, Any]) -> SlurmRecord | None:
    public = _public_json_id(job)
    base = state(job.get("job_state"))
    if public is None or base is None:
        return None
    start, end = number(job.get("start_time")), number(job.get("end_time"))
    return SlurmRecord(public, base, _json_exit(job.get("exit_code")),
                       float(start) if start else None, float(end) if end else None)


def parse_squeue(text: str) -> dict[str, SlurmRecord]:
    """``squeue --json`` output, by the id users see. Every field is Slurm's own value: a job named
    ``JobId=4242 JobState=COMPLETED`` is only a name here (the text form made it a second id)."""
    return _merge(r for r in (_json_record(j) for j in _json_jobs(text)) if r is not None)


def _json_jobs(text: str) -> list[dict[str, Any]]:
    """The jobs of a ``squeue --json`` answer; :class:`SlurmCommandError` when it holds no job list."""
    try:
        answer = json.loads(text)
    except ValueError as exc:
        raise SlurmCommandError("squeue --json printed no JSON") from exc
    jobs = answer.get("jobs") if isinstance(answer, dict) else None
    if not isinstance(jobs, list):
        raise SlurmCommandError("squeue --json printed no job list")
    return [job for job in jobs if isinstance(job, dict)]


def find_command(name: str) -> str | None:
    """The command's path, or ``None`` where this host has no such command."""
    return shutil.which(name)


def _run(argv: Sequence[str], timeout_s: float) -> str:
    """What the command printed; :class:`SlurmCommandError` when it gave no answer. Private: a job id
    reaches it only through the functions below, each of which checks its ids first."""
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    try:
        # A job's name is its user's bytes, not always UTF-8: read as U+FFFD, so that one user's job
        # name cannot make every job's answer unreadable (docs/security.md, boundary 1).
        result = subprocess.run(list(argv), capture_output=True, encoding="utf-8", errors="replace",
                                timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise SlurmCommandError(f"{argv[0]} gave no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise SlurmCommandError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise SlurmCommandError(f"{argv[0]} exited {result.returncode}" + (f": {said[0][:200]}" if said else ""))
    return result.stdout


def ask_sacct(sacct: str, job_ids: Sequence[str], timeout_s: float) -> dict[str, SlurmRecord]:
    """The allocations (``-X``) of ``job_ids``, latest run of each; jobs sacct does not know are absent.
    :class:`NotASlurmJobId` (nothing run) when one of them is not a Slurm job id."""
    job_ids = checked_job_ids(job_ids)
    out: dict[str, SlurmRecord] = {}
    for start in range(0, len(job_ids), SACCT_CHUNK):
        chunk = job_ids[start:start + SACCT_CHUNK]
        # --jobs=<ids> as one argument: the list is the option's value, never an option of its own.
        text = _run([sacct, "--noheader", "--parsable2", "--allocations", "-o", _SACCT_FIELDS,
                     f"--jobs={','.join(chunk)}"], timeout_s)
        out.update(parse_sacct(text))
    return out


def ask_squeue(squeue: str, timeout_s: float) -> dict[str, SlurmRecord]:
    """Every job slurmctld still remembers (``MinJobAge`` after its end), in one call."""
    return parse_squeue(_run([squeue, "--json", "--states=all"], timeout_s))


def admin_comment_in(text: str, job: str) -> str:
    """The ``admin_comment`` of ``job`` (the id users see) in a ``squeue --json`` answer; ``""`` when
    it has none. :class:`SlurmCommandError` when the answer is not JSON or does not hold the job:
    Slurm 22.05 answers with every job it remembers whatever ``--jobs`` says, so the job is picked by id."""
    # A heterogeneous job's components all answer for its leader's id: the leader's own comment first.
    found = sorted((j for j in _json_jobs(text) if _public_json_id(j) == job),
                   key=lambda j: str(number(j.get("job_id"))) != job)
    if not found:
        raise SlurmCommandError(f"squeue --json does not know job {job}")
    comment = found[0].get("admin_comment")
    return comment if isinstance(comment, str) else ""


def read_admin_comment(squeue: str, job: str, timeout_s: float) -> str:
    """The job's ``AdminComment`` as Slurm's structured answer has it (``""``: none); what the site
    keeps there. :class:`SlurmCommandError` when Slurm gave no answer for the job."""
    [job] = checked_job_ids([job])
    return admin_comment_in(_run([squeue, "--json", "--states=all", f"--jobs={job}"], timeout_s), job)


def appended_comment(theirs: str, ours: str, limit: int = MAX_ADMIN_COMMENT) -> str | None:
    """``<theirs>; <ours>``: the site's ``AdminComment`` kept whole, jobsight's reason after it; ``None``
    when nothing is to be written: ``ours`` is there already (a retried step), or both would be longer
    than ``limit`` (the site's text is never cut to make room; the reason stays on the job's page)."""
    if ours in theirs:
        return None
    joined = f"{theirs}; {ours}" if theirs.strip() else ours
    return joined if len(joined) <= limit else None


def write_admin_comment(scontrol: str, job: str, comment: str, timeout_s: float) -> None:
    """Set the job's ``AdminComment`` (the whole text: :func:`appended_comment` keeps the site's)."""
    [job] = checked_job_ids([job])
    # `--` first: scontrol reads its own options up to it whichever way its getopt permutes, and
    # JobId=/AdminComment= are single arguments that cannot read as options.
    _run([scontrol, "--", "update", f"JobId={job}", f"AdminComment={comment}"], timeout_s)


def cancel_job(scancel: str, job: str, timeout_s: float) -> None:
    """``scancel -- <job>``: the one job, never a filter (``--user=``) an id could have spelt."""
    [job] = checked_job_ids([job])
    _run([scancel, "--", job], timeout_s)


def requeue_job(scontrol: str, job: str, timeout_s: float) -> None:
    """``scontrol -- requeue <job>``."""
    [job] = checked_job_ids([job])
    _run([scontrol, "--", "requeue", job], timeout_s)
