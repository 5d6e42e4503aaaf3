"""Reconciliation: no job stays ``running`` after it has ended, whether or not its epilog was heard.

A job's end normally arrives as ``job_ended`` from its epilog. When it never does (the node died,
the hook reached nothing and its spool went with the node), one periodic pass settles it:

* **Slurm's word.** The running jobs with Slurm ids are asked of ``sacct`` where it answers
  (slurmdbd), and those it does not know of ``squeue --json`` (slurmctld remembers a job for
  ``MinJobAge`` after its end). An end state there ends the job: state and exit code as Slurm
  says, Slurm's end time, the summary computed. A job Slurm says still runs or waits is left alone.
* **The lost rule.** A running job Slurm says nothing about (no Slurm on this host, or the job
  forgotten), past its time limit plus ``grace_s`` and with no record from any of its nodes for
  ``grace_s``, is ``lost``: ended at its last record, the reason in ``attrs.end_reason``, its
  summary computed. A job without a time limit is lost after ``no_limit_silent_s`` of silence.
* **Runs outside Slurm** (no Slurm id, no prolog) end when every process of theirs said its run
  ended, or as ``silent`` after ``silent_after_s`` without a record (collector/passes/local_runs.py);
  the lost rule is not theirs.
* **A second look.** Jobs whose epilog ended them in the last ``recheck_ended_s`` are checked once
  against ``sacct``, which may know more (the state only moves up :data:`job_states.SPECIFICITY`).

Every write keeps the most specific state (jobsight/rules/job_states.py), so an epilog heard later still
replaces ``lost`` and a reconciled state, and a replayed ``job_started`` does not revive the job
(its ``end_time`` is set). One collector process reconciles at a time, whatever ``--workers`` is:
:class:`Reconciler` holds a session advisory lock on a connection of its own while it leads, as the
health evaluator does (collector/passes/findings.py).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg.types.json import Jsonb

from jobsight.collector.config.reconcile import ReconcileSettings
from jobsight.collector.jobs.summaries import refresh_ended
from jobsight.collector.passes.leader import LeaderTimer
from jobsight.collector.passes.local_runs import LocalRunRules, is_local_run
from jobsight.collector.passes.slurm_jobs import (
    SlurmCommandError,
    SlurmRecord,
    ask_sacct,
    ask_squeue,
    find_command,
)
from jobsight.collector.store.db import Connection
from jobsight.protocol.slurm_ids import is_slurm_job_id
from jobsight.rules import job_states

log = logging.getLogger("jobsight.collector.passes.reconcile")

RECONCILE_LOCK_KEY: Final = 0x6A6F6273_7265636F & 0x7FFFFFFFFFFFFFFF
"""Session advisory lock held by the one reconciling process."""
RECHECK_MAX_AGE: Final = dt.timedelta(days=31)
"""Jobs that started longer ago than this are not re-checked (bounds the scan by ``start_time``)."""

JobKey = tuple[str, str]
"""cluster, job_id."""

_RUNNING: Final = """
SELECT cluster, job_id, user_name, start_time, coalesce(run_start, start_time) AS run_start, last_seen,
       time_limit_s, nodes
FROM jobs WHERE state = 'running' AND end_time IS NULL AND NOT demo
ORDER BY cluster, job_id
"""

_RECENTLY_ENDED: Final = f"""
SELECT cluster, job_id, start_time, last_seen
FROM jobs
WHERE start_time >= %(oldest)s AND end_time >= %(since)s AND state <> '{job_states.RUNNING}' AND NOT demo
  AND NOT coalesce(attrs ? 'sacct_checked', false)
ORDER BY cluster, job_id
"""

# Only a job still running is ended here: a job_ended committed first has said more.
_END: Final = f"""
UPDATE jobs SET state = %(state)s, exit_code = %(exit_code)s,
       end_time = greatest(start_time, %(end)s),
       attrs = coalesce(attrs, '{{}}'::jsonb) || %(attrs)s
WHERE cluster = %(cluster)s AND job_id = %(job)s AND state = '{job_states.RUNNING}' AND end_time IS NULL
RETURNING job_id
"""

_STORED: Final = job_states.rank_sql("state")
_HEARD: Final = job_states.rank_sql("%(state)s::text")
# sacct's word on a job that has ended: kept where it is at least as specific as what is stored.
_RECHECK: Final = f"""
UPDATE jobs SET state = CASE WHEN {_STORED} <= {_HEARD} THEN %(state)s ELSE state END,
       exit_code = CASE WHEN {_STORED} <= {_HEARD} THEN coalesce(%(exit_code)s, exit_code) ELSE exit_code END,
       attrs = coalesce(attrs, '{{}}'::jsonb) || jsonb_build_object('sacct_checked', true)
               || CASE WHEN {_STORED} < {_HEARD} THEN jsonb_build_object('end_source', 'sacct') ELSE '{{}}' END
WHERE cluster = %(cluster)s AND job_id = %(job)s AND end_time IS NOT NULL
RETURNING state
"""

_PROFILES_ENDED: Final = """
UPDATE profile_requests SET state = 'failed', reason = 'the job ended before the profile was taken',
       updated_at = now()
WHERE cluster = %s AND job_id = %s AND state IN ('pending', 'running')
"""


def _ts(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _duration(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


@dataclass
class Reconciliation:
    """What one pass did, for logs and tests."""

    running: int = 0
    asked: list[str] = field(default_factory=list)
    """The commands that answered (``sacct``, ``squeue``)."""
    failed: list[str] = field(default_factory=list)
    """Why a command gave no answer."""
    ended: dict[JobKey, str] = field(default_factory=dict)
    """Jobs ended by Slurm's word, with the state."""
    lost: list[JobKey] = field(default_factory=list)
    local: dict[JobKey, str] = field(default_factory=dict)
    """Runs outside Slurm ended by their processes' word or their silence, with the state."""
    rechecked: dict[JobKey, str] = field(default_factory=dict)
    """Ended jobs sacct answered for, with the state they have now."""


class JobReconciler:
    """One pass over the running jobs (and the recently ended ones); nothing kept between passes but
    the commands found and the last complaint of each, so a new leader starts from the database."""

    def __init__(self, settings: ReconcileSettings) -> None:
        self.settings = settings
        self.sacct = find_command(settings.sacct)
        self.squeue = find_command(settings.squeue)
        self._complaints: dict[str, str] = {}
        self.local_runs = LocalRunRules(settings, time.time())
        if self.sacct is None and self.squeue is None:
            log.info("reconcile: neither %s nor %s on this host: only the lost rule applies",
                     settings.sacct, settings.squeue)

    # -- asking Slurm ------------------------------------------------------------------------------

    def _complain(self, command: str, message: str, result: Reconciliation) -> None:
        """Log a command's failure once, and again only when what it says changes."""
        result.failed.append(message)
        if self._complaints.get(command) != message:
            self._complaints[command] = message
            log.warning("reconcile: %s", message)

    def _answered(self, command: str) -> None:
        if self._complaints.pop(command, None) is not None:
            log.info("reconcile: %s answers again", command)

    def _ask_sacct(self, job_ids: Sequence[str], result: Reconciliation) -> dict[str, SlurmRecord] | None:
        """``None``: no answer (no sacct, no accounting, timeout)."""
        if self.sacct is None or not job_ids:
            return None
        try:
            records = ask_sacct(self.sacct, job_ids, self.settings.command_timeout_s)
        except SlurmCommandError as exc:
            self._complain("sacct", str(exc), result)
            return None
        self._answered("sacct")
        result.asked.append("sacct")
        return records

    def ask_slurm(self, job_ids: Sequence[str], result: Reconciliation) -> dict[str, tuple[SlurmRecord, str]]:
        """Slurm's record of each job it knows, with the command that said it: ``sacct`` first, then
        ``squeue`` for the jobs ``sacct`` could not answer for."""
        out: dict[str, tuple[SlurmRecord, str]] = {}
        for job, record in (self._ask_sacct(job_ids, result) or {}).items():
            out[job] = (record, "sacct")
        missing = [job for job in job_ids if job not in out]
        if missing and self.squeue is not None:
            try:
                records = ask_squeue(self.squeue, self.settings.command_timeout_s)
            except SlurmCommandError as exc:
                self._complain("squeue", str(exc), result)
            else:
                self._answered("squeue")
                result.asked.append("squeue")
                out.update((job, (records[job], "squeue")) for job in missing if job in records)
        return out

    def _slurm_ids(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        clusters = set(self.settings.clusters)
        return sorted({r["job_id"] for r in rows
                       if is_slurm_job_id(r["job_id"]) and (not clusters or r["cluster"] in clusters)})

    def _describes(self, record: SlurmRecord, row: Mapping[str, Any]) -> bool:
        """Whether Slurm's record is of this job, not of a later job that reused its id: Slurm's start
        lies between the job's start and its last record (a requeued job's later run included)."""
        if record.start is None:
            return record.end_state is None  # pending (a requeued job waiting): still this job
        earliest = row["start_time"].timestamp() - self.settings.start_tolerance_s
        latest = row["last_seen"].timestamp() + self.settings.start_tolerance_s
        return bool(earliest <= record.start <= latest)

    # -- ending jobs ---------------------------------------------------------------------------------

    def _end(self, conn: Connection, row: Mapping[str, Any], state: str, exit_code: int | None, end: float,
             attrs: Mapping[str, Any]) -> bool:
        """End one running job and compute its summary, in one transaction; ``False`` when it is no
        longer running (its ``job_ended`` came first)."""
        with conn.transaction():
            ended = conn.execute(_END, {
                "state": state, "exit_code": exit_code, "end": _ts(end), "attrs": Jsonb(dict(attrs)),
                "cluster": row["cluster"], "job": row["job_id"],
            }).fetchone()
            if ended is None:
                return False
            refresh_ended(conn, row["cluster"], [row["job_id"]])
            conn.execute(_PROFILES_ENDED, (row["cluster"], row["job_id"]))
        return True

    def _lost_reason(self, row: Mapping[str, Any], now: float, sources: str) -> str | None:
        """Why the job is lost, or ``None`` while it is not."""
        grace = self.settings.grace_s
        silent_s = now - row["last_seen"].timestamp()
        nodes = ", ".join(row["nodes"] or []) or "its nodes"
        heard = f"no record from {nodes} since {row['last_seen']:%Y-%m-%d %H:%M:%S} UTC"
        limit = row["time_limit_s"]
        if limit is None:
            after = self.settings.no_limit_silent_s
            if after <= 0 or silent_s < after:
                return None
            return f"{heard} ({_duration(silent_s)} of silence, no time limit); {sources}"
        # The limit counts from the current run's start (a requeued job's later run: collector/jobs/job_runs.py).
        if now < row["run_start"].timestamp() + limit + grace or silent_s < grace:
            return None
        return f"{heard}, past its time limit of {_duration(limit)} plus {grace:g} s of grace; {sources}"

    def _sources(self, job: str, result: Reconciliation, other_job: bool) -> str:
        """What Slurm said of the job, for the reason of its loss."""
        if not is_slurm_job_id(job):
            return "not a Slurm job"
        if self.sacct is None and self.squeue is None:
            return "no sacct or squeue on the collector host"
        if other_job:
            return "Slurm's job of that id started after this one went silent"
        return "Slurm did not know the job" if result.asked else "Slurm gave no answer"

    def _reconcile_running(self, conn: Connection, now: float, result: Reconciliation) -> None:
        rows = conn.execute(_RUNNING).fetchall()
        result.running = len(rows)
        answers = self.ask_slurm(self._slurm_ids(rows), result) if rows else {}
        for row in rows:
            key = (row["cluster"], row["job_id"])
            if is_local_run(row):
                self._reconcile_local(conn, row, now, result)
                continue
            answer = answers.get(row["job_id"])
            if answer is not None and self.settings.clusters and row["cluster"] not in self.settings.clusters:
                answer = None  # that Slurm's job of this id, not this cluster's
            if answer is not None:
                record, source = answer
                if self._describes(record, row):
                    state = record.end_state
                    if state is None or state == job_states.REQUEUED:
                        continue  # Slurm says it runs, waits, or will run again: not over
                    end = record.end or row["last_seen"].timestamp()
                    attrs: dict[str, Any] = {
                        "end_source": source,
                        "end_reason": f"{source}: {record.slurm_state} (the epilog's end was not heard)"}
                    if source == "sacct":
                        attrs["sacct_checked"] = True  # sacct's word already: no second look
                    if self._end(conn, row, state, record.exit_code, end, attrs):
                        result.ended[key] = state
                    continue
            reason = self._lost_reason(row, now, self._sources(row["job_id"], result, answer is not None))
            if reason is None:
                continue
            if self._end(conn, row, job_states.LOST, None, row["last_seen"].timestamp(),
                         {"end_source": "reconcile", "end_reason": reason}):
                result.lost.append(key)

    def _reconcile_local(self, conn: Connection, row: Mapping[str, Any], now: float, result: Reconciliation) -> None:
        ending = self.local_runs.judge(conn, row, now)
        if ending is not None and self._end(conn, row, ending.state, None, ending.end,
                                            {"end_source": ending.source, "end_reason": ending.reason}):
            result.local[(row["cluster"], row["job_id"])] = ending.state

    def _recheck_ended(self, conn: Connection, now: float, result: Reconciliation) -> None:
        if self.settings.recheck_ended_s <= 0 or self.sacct is None:
            return
        since = _ts(now - self.settings.recheck_ended_s)
        rows = conn.execute(_RECENTLY_ENDED, {"since": since, "oldest": since - RECHECK_MAX_AGE}).fetchall()
        records = self._ask_sacct(self._slurm_ids(rows), result) if rows else None
        if not records:
            return
        for row in rows:
            record = records.get(row["job_id"])
            if record is None or record.end_state is None or not self._describes(record, row):
                continue
            if self.settings.clusters and row["cluster"] not in self.settings.clusters:
                continue
            stored = conn.execute(_RECHECK, {"state": record.end_state, "exit_code": record.exit_code,
                                             "cluster": row["cluster"], "job": row["job_id"]}).fetchone()
            if stored is not None:
                result.rechecked[(row["cluster"], row["job_id"])] = stored["state"]

    def reconcile_once(self, conn: Connection, now: float | None = None) -> Reconciliation:
        """One pass (``conn`` in autocommit mode, rows as dicts)."""
        now = time.time() if now is None else now
        result = Reconciliation()
        self._reconcile_running(conn, now, result)
        self._recheck_ended(conn, now, result)
        return result


class Reconciler(LeaderTimer[Reconciliation]):
    """The timer: reconciles while this process leads (:data:`RECONCILE_LOCK_KEY`)."""

    def __init__(self, database_url: str, settings: ReconcileSettings) -> None:
        super().__init__(database_url, RECONCILE_LOCK_KEY, "reconcile", settings.interval_s)
        self.settings = settings
        self.jobs = JobReconciler(settings)

    def work(self, conn: psycopg.Connection[dict[str, Any]]) -> Reconciliation:
        return self.jobs.reconcile_once(conn)

    def describe(self, result: Reconciliation) -> str | None:
        if not (result.ended or result.lost or result.local):
            return None
        return (f"{result.running} running jobs, {len(result.ended)} ended as Slurm says, {len(result.lost)} lost, "
                f"{len(result.local)} outside Slurm ended")


def start_reconciler(database_url: str, settings: ReconcileSettings, stop: threading.Event) -> None:
    """Run the pass every ``interval_s`` in a daemon thread until ``stop`` is set; nothing when it is 0."""
    if settings.interval_s > 0:
        threading.Thread(target=Reconciler(database_url, settings).run, args=(stop,), name="jobsight-reconcile",
                         daemon=True).start()
