"""A job's log lines with each line's rank, also for lines that were sent without one.

The log handler tags a line with the rank it reads from the environment (``RANK``,
``SLURM_PROCID``); a single-process Lightning run, the demo among them, sets neither, so its
lines arrive with no rank while the same process's steps, run events and profiles carry the
rank the framework knows (0). A line without a rank takes the rank of its process: the one rank
that the job's records with a rank give to its ``(node, pid)``. A process seen with two ranks
(a pid reused by a restarted run) gives none: better no rank than a wrong one.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from jobsight.collector.query.jobs import MAX_PAGE
from jobsight.collector.store.db import Connection

LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
STEP_WINDOW: Final = dt.timedelta(minutes=1)
"""Steps are read for the pid → rank map over the job's last minute of steps only: ``steps`` has
no index on pid, and a job's every step is millions of rows; each live rank steps in that minute,
and a process that ended earlier is known from its run events and profiles."""

# The pid → rank map of a job: every (node, pid) that records with a rank name with exactly one.
_PID_RANKS = """
pid_ranks AS (
    SELECT node, pid, min(rank) AS rank FROM (
        SELECT node, pid, rank FROM log_events
        WHERE job_id = %(job)s AND cluster = %(cluster)s AND rank IS NOT NULL AND pid IS NOT NULL
        UNION ALL
        SELECT node, pid, rank FROM profiles
        WHERE job_id = %(job)s AND cluster = %(cluster)s AND rank IS NOT NULL AND pid IS NOT NULL
        UNION ALL
        SELECT node, pid, rank FROM steps
        WHERE job_id = %(job)s AND cluster = %(cluster)s AND rank IS NOT NULL AND pid IS NOT NULL
          AND ts >= (SELECT max(ts) FROM steps WHERE job_id = %(job)s AND cluster = %(cluster)s) - %(step_window)s
    ) known
    GROUP BY node, pid
    HAVING count(DISTINCT rank) = 1
)"""

_LOG_EVENTS = f"""
WITH {_PID_RANKS}
SELECT l.ts, l.node, coalesce(l.rank, m.rank) AS rank, l.rank IS NULL AND m.rank IS NOT NULL AS rank_from_pid,
       l.pid, l.tid, l.thread, l.level, l.logger, l.message, l.exception, l.attrs
FROM log_events l
LEFT JOIN pid_ranks m ON m.node IS NOT DISTINCT FROM l.node AND m.pid = l.pid AND l.rank IS NULL
WHERE l.job_id = %(job)s AND l.cluster = %(cluster)s
  AND (%(rank)s::int IS NULL OR coalesce(l.rank, m.rank) = %(rank)s)
  AND (%(pid)s::int IS NULL OR l.pid = %(pid)s)
  AND (%(tid)s::bigint IS NULL OR l.tid = %(tid)s)
  AND (%(levels)s::text[] IS NULL OR l.level = ANY(%(levels)s))
  AND (%(text)s::text IS NULL OR l.message ILIKE %(pattern)s OR l.exception ILIKE %(pattern)s)
  AND (%(start)s::timestamptz IS NULL OR l.ts >= %(start)s)
  AND (%(end)s::timestamptz IS NULL OR l.ts <= %(end)s)
ORDER BY l.ts DESC LIMIT %(limit)s OFFSET %(offset)s"""


def log_events(
    conn: Connection,
    cluster: str,
    job_id: str,
    *,
    rank: int | None = None,
    pid: int | None = None,
    tid: int | None = None,
    level: str | None = None,
    text: str | None = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    limit: int = 200,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Log lines, newest first, each with its rank: the line's own, else its process's (see the
    module docstring); ``rank_from_pid`` says the rank came from the process. ``rank`` filters on
    that rank; ``level`` is a minimum (``WARNING`` includes ``ERROR``); ``text`` matches message or
    exception, case-insensitively."""
    wanted = list(LEVELS[LEVELS.index(level.upper()):]) if level and level.upper() in LEVELS else None
    return conn.execute(_LOG_EVENTS, {
        "job": job_id, "cluster": cluster, "rank": rank, "pid": pid, "tid": tid, "levels": wanted, "text": text,
        "pattern": f"%{_escape_like(text)}%" if text else None, "start": start, "end": end,
        "limit": min(max(limit, 1), MAX_PAGE), "offset": max(offset, 0), "step_window": STEP_WINDOW,
    }).fetchall()


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
