"""``jobs.last_seen`` (and a workstation job's ``start_time``) without a write per batch.

Every node of a job sends its batches under the job's one ``jobs`` row. Writing that row in
every batch's transaction made all of them queue on its row lock, for as long as each
transaction lasted. Now the ingest transaction writes it only when it must:

* a job this process has not written yet (the row may not exist: a record creates it);
* a job with ``job_started`` or ``job_ended`` records in the group (those update the row);
* a record earlier than the earliest this process wrote (a job without a prolog starts at
  its earliest record).

Otherwise the job's latest record time is kept here, and :func:`flush` writes it (the
group-commit writers call it every ``last_seen_flush_s``) in a transaction of its own that
touches nothing else and commits at once. So ``last_seen`` lags the records by about that
much at most, and a job's row is written once per interval per collector process, never
while a group holds other locks. Processes each keep their own view; the writes are
``greatest``/``least`` merges, so the order they land in does not matter.

Only what a committed transaction wrote is recorded (:meth:`JobsSeen.committed`), so a group
that rolls back leaves nothing here that the database does not have.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Final

from jobsight.collector.store.db import Connection
from jobsight.collector.store.timestamps import ts_from_us

JobKey = tuple[str, str]
"""(cluster, job id)."""
Span = tuple[int, int]
"""First and last record time, µs since the epoch."""

FORGET_AFTER_S: Final = 600.0
"""A job with no record for this long is forgotten (its next record writes the row again)."""
MAX_JOBS: Final = 100_000

_UPSERT: Final = """
INSERT INTO jobs AS j (cluster, job_id, start_time, first_seen, last_seen)
SELECT cluster, job, first, now(), last
FROM unnest(%s::text[], %s::text[], %s::timestamptz[], %s::timestamptz[]) AS s(cluster, job, first, last)
ON CONFLICT (cluster, job_id) DO UPDATE
SET last_seen = greatest(j.last_seen, excluded.last_seen),
    start_time = CASE WHEN j.user_name IS NULL THEN least(j.start_time, excluded.start_time)
                      ELSE j.start_time END
"""
"""A record for a job the collector has not seen creates it (workstation runs have no prolog).
Such a job starts at its earliest record. A job the prolog registered (it has a user) keeps the
prolog's start: a training process's clock does not move Slurm's accounting."""

# Only moves last_seen forward, and never makes a row: a pending time is flushed after its
# records were committed, and a job removed since must not come back.
_FLUSH: Final = """
UPDATE jobs AS j SET last_seen = s.last
FROM unnest(%s::text[], %s::text[], %s::timestamptz[]) AS s(cluster, job, last)
WHERE j.cluster = s.cluster AND j.job_id = s.job AND j.last_seen < s.last
"""


@dataclass(slots=True)
class _Seen:
    first: int
    """The earliest record time written to the row (its ``start_time`` is at most this)."""
    last: int
    """The latest record time written to the row (``last_seen``)."""
    pending: int
    """The latest committed record time, written or not (>= ``last``)."""
    touched: float


class JobsSeen:
    """What this process wrote of each job's record times, and what it has yet to write
    (shared by the group-commit writer threads)."""

    def __init__(self) -> None:
        self._jobs: dict[JobKey, _Seen] = {}
        self._lock = threading.Lock()

    def due(self, spans: dict[JobKey, Span], force: set[JobKey]) -> dict[JobKey, Span]:
        """Of a group's jobs (``spans``: first and last record time), those whose row the
        group must write, with the times to write (any pending time folded in)."""
        out: dict[JobKey, Span] = {}
        with self._lock:
            for key, (first, last) in spans.items():
                seen = self._jobs.get(key)
                if seen is None:
                    out[key] = (first, last)
                elif key in force or first < seen.first:
                    out[key] = (first, max(last, seen.pending))
        return out

    def committed(self, spans: dict[JobKey, Span], written: dict[JobKey, Span]) -> None:
        """Record a committed group: ``spans`` its jobs' record times, ``written`` what it
        wrote to their rows (:meth:`due`)."""
        now = time.monotonic()
        with self._lock:
            for key, (first, last) in written.items():
                seen = self._jobs.get(key)
                if seen is None:
                    self._jobs[key] = _Seen(first, last, last, now)
                else:
                    seen.first, seen.last = min(seen.first, first), max(seen.last, last)
            for key, (_, last) in spans.items():
                seen = self._jobs.get(key)
                if seen is not None:
                    seen.pending = max(seen.pending, seen.last, last)
                    seen.touched = now
            if len(self._jobs) > MAX_JOBS:  # far more live jobs than any cluster: start over
                self._jobs.clear()

    def unflushed(self) -> dict[JobKey, int]:
        """Jobs whose latest committed record time is past the ``last_seen`` written."""
        with self._lock:
            return {key: seen.pending for key, seen in self._jobs.items() if seen.pending > seen.last}

    def flushed(self, times: dict[JobKey, int]) -> None:
        """Record a committed :func:`flush`, and forget jobs that went quiet."""
        stale = time.monotonic() - FORGET_AFTER_S
        with self._lock:
            for key, last in times.items():
                seen = self._jobs.get(key)
                if seen is not None:
                    seen.last = max(seen.last, last)
            for key in [k for k, seen in self._jobs.items() if seen.touched < stale and seen.pending <= seen.last]:
                del self._jobs[key]


def upsert_jobs(conn: Connection, spans: dict[JobKey, Span]) -> None:
    """Create or move the rows of ``spans``' jobs, in key order (concurrent groups lock the
    rows in the same order, so they cannot deadlock on them)."""
    if not spans:
        return
    keys = sorted(spans)
    conn.execute(
        _UPSERT,
        (
            [k[0] for k in keys],
            [k[1] for k in keys],
            [ts_from_us(spans[k][0]) for k in keys],
            [ts_from_us(spans[k][1]) for k in keys],
        ),
    )


def flush(conn: Connection, times: dict[JobKey, int]) -> None:
    """Write pending ``last_seen`` times, in key order."""
    if not times:
        return
    keys = sorted(times)
    conn.execute(_FLUSH, ([k[0] for k in keys], [k[1] for k in keys], [ts_from_us(times[k]) for k in keys]))
