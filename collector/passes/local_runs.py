"""Runs outside Slurm: ended when their processes say so, or once they fall silent.

A run outside Slurm (a local job id such as ``local-<host>-<pid>-<start>``, or any id that is not
Slurm's, with no prolog registration) has no epilog to end it and no Slurm to ask. Its training
processes say when their run starts and ends (:mod:`jobsight.protocol.run_events`;
``agent/training/process_end.py`` makes a clean exit say so). The reconciliation pass
(collector/passes/reconcile.py) ends such a job by one of two rules:

* **Its processes ended.** Every process (node, pid) that said its run started has said since that
  it ended, and nothing of the job arrived for ``ended_quiet_s``: the job ends at the last end
  event, ``failed`` when a process ended by an exception, else ``completed``. torchrun's ranks share
  their launcher's local id, so the job ends when the last of them ends, not when rank 0 does.
* **Silence.** No record for ``silent_after_s`` while some process has not said it ended (SIGKILL,
  the OOM killer, a node gone) or none ever said anything (records posted by hand): the job ends as
  ``silent`` at its last record. The silence counts from the later of the job's last record and
  the start of this reconciler, so a collector that was away does not end every run before the
  spools kept meanwhile arrive.

Only the event's name, its sender (node, pid) and its time are read: a process can end no run but
its own job's, which its token may write anyway.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from jobsight.collector.config.reconcile import ReconcileSettings
from jobsight.collector.store.db import Connection
from jobsight.protocol.run_events import END_EVENTS, EXCEPTION, START_EVENTS
from jobsight.protocol.slurm_ids import is_slurm_job_id
from jobsight.rules import job_states

_PROCESS_EVENTS: Final = """
SELECT node, pid, attrs->>'event' AS event, max(ts) AS ts
FROM log_events
WHERE cluster = %(cluster)s AND job_id = %(job)s AND ts >= %(start)s AND attrs->>'event' = ANY(%(events)s)
GROUP BY node, pid, attrs->>'event'
"""

Process = tuple[str | None, int | None]
"""node, pid."""


@dataclass(frozen=True)
class ProcessEnds:
    """What a run's processes said of their end."""

    processes: int
    """Processes that said their run started or ended."""
    ended: int
    """Of those, the ones whose latest run has ended."""
    failed: int
    """Of those, the ones whose latest run ended by an exception."""
    last_end: dt.datetime | None
    """The latest end event of an ended process."""

    @property
    def all_ended(self) -> bool:
        return self.processes > 0 and self.ended == self.processes


@dataclass(frozen=True)
class LocalEnd:
    """How a run outside Slurm ends: its state, when, and why."""

    state: str
    end: float
    source: str
    reason: str


def is_local_run(row: Mapping[str, Any]) -> bool:
    """A job no prolog registered (no user) whose id is not Slurm's: nothing but its processes can end it."""
    return row["user_name"] is None and not is_slurm_job_id(row["job_id"])


def tally(rows: Iterable[Mapping[str, Any]]) -> ProcessEnds:
    """Each process's latest start and the end events after it (``rows``: node, pid, event, ts). An end
    heard before the latest start ended an earlier run of the same process (a second ``fit``)."""
    seen: dict[Process, dict[str, dt.datetime]] = {}
    for row in rows:
        seen.setdefault((row["node"], row["pid"]), {})[row["event"]] = row["ts"]
    ended = failed = 0
    last_end: dt.datetime | None = None
    for events in seen.values():
        starts = [ts for event, ts in events.items() if event in START_EVENTS]
        since = max(starts) if starts else None
        ends = {event: ts for event, ts in events.items()
                if event in END_EVENTS and (since is None or ts >= since)}
        if not ends:
            continue
        ended += 1
        failed += int(EXCEPTION in ends)
        latest = max(ends.values())
        last_end = latest if last_end is None else max(last_end, latest)
    return ProcessEnds(len(seen), ended, failed, last_end)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}es"


def _duration(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class LocalRunRules:
    """The two rules over one running job outside Slurm; ``started_at``: when this reconciler started
    (Unix seconds), before which no silence is counted."""

    def __init__(self, settings: ReconcileSettings, started_at: float) -> None:
        self.settings = settings
        self.started_at = started_at

    def judge(self, conn: Connection, row: Mapping[str, Any], now: float) -> LocalEnd | None:
        """How the job ends now, or ``None`` while it runs (``row``: the pass's running job)."""
        last_seen = row["last_seen"].timestamp()
        quiet_s = now - last_seen
        if quiet_s < self.settings.ended_quiet_s:
            return None  # records still arrive: some process runs (and reading its events would cost)
        ends = tally(conn.execute(_PROCESS_EVENTS, {
            "cluster": row["cluster"], "job": row["job_id"], "start": row["start_time"],
            "events": [*START_EVENTS, *END_EVENTS]}))
        if ends.all_ended and ends.last_end is not None:
            word = "ended" if ends.processes == 1 else "all ended"
            reason = f"{_plural(ends.processes, 'process')} of the run said they {word}"
            if ends.failed:
                reason += f" ({ends.failed} by an exception)"
            state = job_states.FAILED if ends.failed else job_states.COMPLETED
            return LocalEnd(state, ends.last_end.timestamp(), "processes", reason)
        silent_after = self.settings.silent_after_s
        silent_s = now - max(last_seen, self.started_at)
        if silent_after <= 0 or silent_s < silent_after:
            return None
        said = (f"{ends.ended} of {_plural(ends.processes, 'process')} said they ended" if ends.processes
                else "no process said it started or ended")
        reason = (f"no record since {row['last_seen']:%Y-%m-%d %H:%M:%S} UTC ({_duration(quiet_s)} of silence), "
                  f"a run outside Slurm whose processes stopped without a word ({said})")
        return LocalEnd(job_states.SILENT, last_seen, "reconcile", reason)
