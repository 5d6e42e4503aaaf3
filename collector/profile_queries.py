"""Profiler snippets and on-demand profile requests: reads for the dashboard and the
one write both the dashboard and the API use to ask a job for a profile."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobsight.collector.db import Connection

MAX_REQUEST_STEPS = 1000


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


def profile_trace(conn: Connection, cluster: str, job_id: str, profile_row_id: int) -> bytes | None:
    """The gzip Chrome trace of one profile row; ``None`` when it has none or is not this job's."""
    row = conn.execute(
        "SELECT trace_gz FROM profiles WHERE id = %s AND job_id = %s AND cluster = %s",
        (profile_row_id, job_id, cluster),
    ).fetchone()
    return bytes(row["trace_gz"]) if row and row["trace_gz"] is not None else None


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


def request_profile(
    conn: Connection,
    cluster: str,
    job_id: str,
    steps: int,
    ranks: Sequence[int] | None,
    requested_by: str | None,
) -> int:
    """Ask the job to profile its next ``steps`` steps on ``ranks`` (``None``: every rank).
    Returns the request id; the agent picks pending requests up from the collector."""
    if not 1 <= steps <= MAX_REQUEST_STEPS:
        raise ValueError(f"steps must be between 1 and {MAX_REQUEST_STEPS}, not {steps}")
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
