"""What Slurm itself says about jobs, from ``sacct`` (slurmdbd's accounting) or ``squeue --json``
(slurmctld's memory, ``MinJobAge`` after a job ends), for the reconciliation pass. Only fields no
user writes are read: ``sacct``'s chosen columns, ``squeue``'s JSON values (never a job's name).

Each command runs with a timeout and ``SLURM_TIME_FORMAT=%s`` (times as epoch seconds, whatever the
host's time zone). A command that is missing, times out, exits non-zero (``sacct`` on a cluster
without accounting says "Slurm accounting storage is disabled") or prints nothing usable is *no
answer*: :class:`SlurmCommandError`, which the caller turns into a log line.

Job ids are the ones users see and jobsight stores: ``1234``, an array task ``1234_7``; the
components of a heterogeneous job (``1234+0``, ``1234+1``) answer for ``1234`` together.
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

from jobsight.protocol import job_states
from jobsight.protocol.slurm_json import exit_pair, number, state

SACCT_CHUNK: Final = 200
"""Job ids per ``sacct -j`` call (its command line stays short)."""
_SACCT_FIELDS: Final = "JobID,State,ExitCode,Start,End"


class SlurmCommandError(RuntimeError):
    """A Slurm command gave no answer; the message says which and why."""


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


def _json_record(job: Mapping[str, Any]) -> SlurmRecord | None:
    own = number(job.get("job_id"))
    base = state(job.get("job_state"))
    if own is None or base is None:
        return None
    array, task, het = (number(job.get(k)) for k in ("array_job_id", "array_task_id", "het_job_id"))
    public = f"{array}_{task}" if array and task is not None and task >= 0 else str(het) if het else str(own)
    start, end = number(job.get("start_time")), number(job.get("end_time"))
    return SlurmRecord(public, base, _json_exit(job.get("exit_code")),
                       float(start) if start else None, float(end) if end else None)


def parse_squeue(text: str) -> dict[str, SlurmRecord]:
    """``squeue --json`` output, by the id users see. Every field is Slurm's own value: a job named
    ``JobId=4242 JobState=COMPLETED`` is only a name here (the text form made it a second id)."""
    try:
        answer = json.loads(text)
    except ValueError as exc:
        raise SlurmCommandError("squeue --json printed no JSON") from exc
    jobs = answer.get("jobs") if isinstance(answer, dict) else None
    if not isinstance(jobs, list):
        raise SlurmCommandError("squeue --json printed no job list")
    return _merge(r for r in (_json_record(j) for j in jobs if isinstance(j, dict)) if r is not None)


def find_command(name: str) -> str | None:
    """The command's path, or ``None`` where this host has no such command."""
    return shutil.which(name)


def run_slurm_command(argv: Sequence[str], timeout_s: float) -> str:
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
    """The allocations (``-X``) of ``job_ids``, latest run of each; jobs sacct does not know are absent."""
    out: dict[str, SlurmRecord] = {}
    for start in range(0, len(job_ids), SACCT_CHUNK):
        chunk = job_ids[start:start + SACCT_CHUNK]
        text = run_slurm_command([sacct, "--noheader", "--parsable2", "--allocations", "-o", _SACCT_FIELDS,
                     "-j", ",".join(chunk)], timeout_s)
        out.update(parse_sacct(text))
    return out


def ask_squeue(squeue: str, timeout_s: float) -> dict[str, SlurmRecord]:
    """Every job slurmctld still remembers (``MinJobAge`` after its end), in one call."""
    return parse_squeue(run_slurm_command([squeue, "--json", "--states=all"], timeout_s))
