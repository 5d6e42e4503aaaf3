"""Profiler snippets and on-demand profile requests: the reads of the dashboard and the API,
and the writes that move a request through its states (the API's routes hold no SQL)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobsight.collector.config.settings import DEFAULT_MAX_OPEN_PROFILE_REQUESTS
from jobsight.collector.store.db import Connection

MAX_REQUEST_STEPS = 1000
PENDING_TIMEOUT = dt.timedelta(minutes=10)
"""A request no agent has taken by then fails: the job has no jobsight callback, or is stuck."""


@dataclass(frozen=True)
class TraceFile:
    """One profile row's stored trace and what its download is named after."""

    trace_gz: bytes
    rank: int | None
    """``None``: the profile did not say which rank took it."""
    profile_id: str


def list_profiles(conn: Connection, cluster: str, job_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """A job's profiles, newest first, without the trace itself (``trace_bytes`` is its size,
    ``None`` when the snippet carried no trace)."""
    return conn.execute(
        """SELECT id, ts, node, rank, pid, profile_id, request_id, step_start, step_end,
                  summary, diagnosis, note, octet_length(trace_gz) AS trace_bytes
           FROM profiles WHERE job_id = %s AND cluster = %s
           ORDER BY ts DESC, rank NULLS FIRST LIMIT %s""",
        (job_id, cluster, max(1, min(limit, 1000))),
    ).fetchall()


def profile_trace_file(conn: Connection, cluster: str, job_id: str, profile_row_id: int) -> TraceFile | None:
    """The gzip Chrome trace of one profile row with its rank and profile id; ``None`` when the
    row has no trace or is not this job's."""
    row = conn.execute(
        "SELECT trace_gz, rank, profile_id FROM profiles WHERE id = %s AND job_id = %s AND cluster = %s",
        (profile_row_id, job_id, cluster),
    ).fetchone()
    if row is None or row["trace_gz"] is None:
        return None
    return TraceFile(bytes(row["trace_gz"]), row["rank"], row["profile_id"])


def profile_trace(conn: Connection, cluster: str, job_id: str, profile_row_id: int) -> bytes | None:
    """The gzip Chrome trace of one profile row; ``None`` when it has none or is not this job's."""
    found = profile_trace_file(conn, cluster, job_id, profile_row_id)
    return found.trace_gz if found is not None else None


def latest_profiles(conn: Connection, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """Per rank, the job's newest profile: id, rank, profile id, its stored hints (``diagnosis``,
    ``None`` when the snippet had none) and its time breakdown (``breakdown``, ``None`` when the
    summary has none): what the job's diagnosis compares across ranks, without the op lists."""
    return conn.execute(
        """SELECT DISTINCT ON (rank) id, rank, profile_id, diagnosis, summary -> 'breakdown' AS breakdown
           FROM profiles WHERE job_id = %s AND cluster = %s ORDER BY rank, ts DESC""",
        (job_id, cluster),
    ).fetchall()


def profile_windows(conn: Connection, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """Per profile id: the time window it covered, from the job's step records in its step
    range; without step records, the window is the instant the profile was recorded."""
    return conn.execute(
        """WITH p AS (SELECT profile_id, min(step_start) AS step_start, max(step_end) AS step_end,
                             min(ts) AS recorded
                      FROM profiles WHERE job_id = %(job)s AND cluster = %(cluster)s GROUP BY profile_id)
           SELECT p.profile_id, p.step_start, p.step_end,
                  coalesce(w.start, p.recorded) AS start, coalesce(w.end, p.recorded) AS end
           FROM p LEFT JOIN LATERAL (
               SELECT min(s.ts) AS start, max(s.ts) AS end FROM steps s
               WHERE s.job_id = %(job)s AND s.cluster = %(cluster)s
                 AND s.step BETWEEN p.step_start AND p.step_end) w ON p.step_start IS NOT NULL
           ORDER BY start""",
        {"job": job_id, "cluster": cluster},
    ).fetchall()


REQUEST_LOCK_CLASS = 0x70726F66
"""First key of the two-key transaction advisory lock taken per job while its open requests are
counted and one is added, so that two at once cannot both pass the bound."""
MAX_OPEN_REQUESTS = DEFAULT_MAX_OPEN_PROFILE_REQUESTS
"""Pending or running requests one job may have where no settings say (the dashboard's way in)."""


class TooManyOpenRequests(Exception):
    """The job already has ``most`` requests pending or running; the API answers 429."""

    def __init__(self, job_id: str, count: int, most: int) -> None:
        super().__init__(f"job {job_id} has {count} profile requests pending or running, the most the collector's "
                         f"max_open_profile_requests allows ({most}): ask again once one is done or failed")
        self.count, self.most = count, most


def _check_open_requests(conn: Connection, cluster: str, job_id: str, most: int) -> None:
    """Raise :class:`TooManyOpenRequests` when the job has ``most`` open requests. Holds a per-job lock
    to the end of the caller's transaction; requests no agent took in time are failed first, as the
    listing does, so that they do not count."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (REQUEST_LOCK_CLASS, f"{cluster}/{job_id}"))
    fail_untaken_requests(conn, cluster, job_id)
    row = conn.execute(
        """SELECT count(*) AS open FROM profile_requests
           WHERE job_id = %s AND cluster = %s AND state IN ('pending', 'running')""",
        (job_id, cluster),
    ).fetchone()
    count = int(row["open"] if isinstance(row, dict) else row[0]) if row is not None else 0
    if count >= most:
        raise TooManyOpenRequests(job_id, count, most)


def request_profile(
    conn: Connection,
    cluster: str,
    job_id: str,
    steps: int,
    ranks: Sequence[int] | None,
    requested_by: str | None,
    most_open: int = MAX_OPEN_REQUESTS,
) -> int:
    """Ask the job to profile its next ``steps`` steps on ``ranks`` (``None``: every rank).
    Returns the request id; the agent picks pending requests up from the collector. Every way in
    (the API, the dashboard) goes through here, so each is bounded by ``most_open``
    (:class:`TooManyOpenRequests`)."""
    if not 1 <= steps <= MAX_REQUEST_STEPS:
        raise ValueError(f"steps must be between 1 and {MAX_REQUEST_STEPS}, not {steps}")
    _check_open_requests(conn, cluster, job_id, most_open)
    row = conn.execute(
        """INSERT INTO profile_requests (cluster, job_id, requested_by, steps, ranks)
           VALUES (%s, %s, %s, %s, %s) RETURNING id""",
        (cluster, job_id, requested_by, steps, sorted(set(ranks)) if ranks else None),
    ).fetchone()
    assert row is not None  # INSERT ... RETURNING always returns the row
    return int(row["id"] if isinstance(row, dict) else row[0])


def profile_requests(conn: Connection, cluster: str, job_id: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """A job's profile requests, newest first."""
    return conn.execute(
        """SELECT id, created_at, updated_at, requested_by, steps, ranks, state, reason, profile_id
           FROM profile_requests WHERE job_id = %s AND cluster = %s ORDER BY id DESC LIMIT %s""",
        (job_id, cluster, max(1, min(limit, 200))),
    ).fetchall()


def fail_untaken_requests(conn: Connection, cluster: str, job_id: str) -> int:
    """Fail the job's requests still pending after :data:`PENDING_TIMEOUT`, saying why;
    returns how many."""
    return conn.execute(
        """UPDATE profile_requests SET state = 'failed', updated_at = now(),
               reason = 'no agent took the request within ' || %(minutes)s
                        || ' minutes (is the jobsight callback in use?)'
           WHERE cluster = %(cluster)s AND job_id = %(job)s AND state = 'pending'
             AND created_at < now() - %(timeout)s""",
        {
            "minutes": str(int(PENDING_TIMEOUT.total_seconds() // 60)),
            "cluster": cluster,
            "job": job_id,
            "timeout": PENDING_TIMEOUT,
        },
    ).rowcount


def open_profile_requests(conn: Connection, cluster: str, job_id: str, rank: int | None) -> list[dict[str, Any]]:
    """The job's pending and running requests (id, steps, ranks, state) addressed to ``rank``
    (``None``: any rank), oldest first; requests older than :data:`PENDING_TIMEOUT` are left
    out, so an agent never starts one the API is about to fail."""
    return conn.execute(
        """SELECT id, steps, ranks, state FROM profile_requests
           WHERE job_id = %(job)s AND cluster = %(cluster)s AND state IN ('pending', 'running')
             AND (ranks IS NULL OR %(rank)s::int IS NULL OR %(rank)s::int = ANY(ranks))
             AND created_at >= now() - %(timeout)s
           ORDER BY id""",
        {"job": job_id, "cluster": cluster, "rank": rank, "timeout": PENDING_TIMEOUT},
    ).fetchall()


def lock_profile_request(conn: Connection, request_id: int) -> dict[str, Any] | None:
    """The request's id, cluster, job id and state, locked until the caller's transaction ends;
    ``None`` when there is no such request."""
    return conn.execute(
        "SELECT id, cluster, job_id, state FROM profile_requests WHERE id = %s FOR UPDATE", (request_id,)
    ).fetchone()


def set_profile_request_state(
    conn: Connection, request_id: int, state: str, reason: str | None, profile_id: str | None
) -> None:
    """Move a request to ``state`` with ``reason`` (``None`` clears it); ``profile_id`` ``None``
    keeps the one the request already has."""
    conn.execute(
        """UPDATE profile_requests SET state = %(state)s, reason = %(reason)s,
               profile_id = coalesce(%(profile_id)s, profile_id), updated_at = now()
           WHERE id = %(id)s""",
        {"state": state, "reason": reason, "profile_id": profile_id, "id": request_id},
    )
