"""The runs of a requeued job: Slurm gives each run the same job id and counts them in
``SLURM_JOB_RESTART_COUNT``, which the hooks send as ``run`` on ``job_started``/``job_ended``.

The job row holds the **latest** run: ``jobs.run``, ``jobs.run_start`` (NULL for run 0, which
starts at ``start_time``) and, as before, its end, state and exit code. When a ``job_started`` of
a higher run arrives, the run it replaces is closed into ``job_runs`` (start, end, state and exit
code as the job row had them) and the job row starts over: running, no end. So the most specific
end state (jobsight/rules/job_states.py) is kept per run, and a ``requeued`` run 0 does not outrank a
``completed`` run 1.

Everything measured (samples, steps) carries only the job id; a run is its time span. Reads and
the summary of a job take ``ts >= run_start`` (:func:`run_start_sql`), so earlier runs are not
mixed in, while GPU-hours add every run's elapsed time (:func:`earlier_runs_s`).

An earlier run's ``job_ended`` that arrives after the next run started (a replayed spool) only
fills that run's end in ``job_runs``: it must not end the run now going on.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from jobsight.collector.store.db import Connection

# The job row's latest run's start, for reads that take ``ts >= <this>`` (table alias ``j``).
RUN_START: Final = "coalesce(j.run_start, j.start_time, '-infinity'::timestamptz)"

_CLOSE_AND_START = """
WITH closed AS (
    INSERT INTO job_runs (cluster, job_id, run, start_time, end_time, state, exit_code)
    SELECT cluster, job_id, run, coalesce(run_start, start_time), end_time,
           CASE WHEN end_time IS NULL THEN NULL ELSE state END, exit_code
    FROM jobs WHERE cluster = %(cluster)s AND job_id = %(job)s AND run < %(run)s
    ON CONFLICT (cluster, job_id, run) DO UPDATE SET
        start_time = coalesce(job_runs.start_time, excluded.start_time),
        end_time = coalesce(excluded.end_time, job_runs.end_time),
        state = coalesce(excluded.state, job_runs.state),
        exit_code = coalesce(excluded.exit_code, job_runs.exit_code)
    RETURNING job_id
), stale AS (
    -- the replaced run's summary: the job runs again, and its summary comes at this run's end
    DELETE FROM job_summaries s USING closed c WHERE s.cluster = %(cluster)s AND s.job_id = c.job_id
)
UPDATE jobs SET run = %(run)s, run_start = %(ts)s, end_time = NULL, exit_code = NULL, state = 'running'
WHERE cluster = %(cluster)s AND job_id = %(job)s AND run < %(run)s
"""

# A run that is not the job's latest, heard of late: a row of its own (the start of a run that
# came before the stored one, or the end of one that was already closed).
_EARLIER_STARTED = """
INSERT INTO job_runs (cluster, job_id, run, start_time)
SELECT cluster, job_id, %(run)s, %(ts)s FROM jobs
WHERE cluster = %(cluster)s AND job_id = %(job)s AND run > %(run)s
ON CONFLICT (cluster, job_id, run) DO UPDATE SET start_time = least(job_runs.start_time, excluded.start_time)
"""

_EARLIER_ENDED = """
INSERT INTO job_runs (cluster, job_id, run, end_time, exit_code)
SELECT cluster, job_id, %(run)s, %(ts)s, %(exit_code)s FROM jobs
WHERE cluster = %(cluster)s AND job_id = %(job)s AND run > %(run)s
ON CONFLICT (cluster, job_id, run) DO UPDATE SET
    end_time = greatest(job_runs.end_time, excluded.end_time),
    exit_code = coalesce(job_runs.exit_code, excluded.exit_code)
RETURNING run
"""


def _params(cluster: str, r: dict[str, Any]) -> dict[str, Any]:
    # ``ts`` is a datetime already (ingest_rows.prepare).
    return {"cluster": cluster, "job": r["job"], "run": r["run"], "ts": r["ts"], "exit_code": r.get("exit_code")}


def started(conn: Connection, cluster: str, r: dict[str, Any]) -> None:
    """Before the ``job_started`` is merged: a higher run closes the current one and starts anew;
    a lower one (arriving late) is only recorded. Records without ``run`` change nothing."""
    if r.get("run") is None:
        return
    params = _params(cluster, r)
    conn.execute(_CLOSE_AND_START, params)
    conn.execute(_EARLIER_STARTED, params)


def is_current(conn: Connection, cluster: str, r: dict[str, Any]) -> bool:
    """Whether a ``job_ended`` ends the job's latest run (records without ``run`` do). The end of
    an earlier run goes into its ``job_runs`` row instead, and ``False`` says to leave the job be."""
    if r.get("run") is None:
        return True
    return conn.execute(_EARLIER_ENDED, _params(cluster, r)).fetchone() is None


def earlier_runs(conn: Connection, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """The job's earlier runs, oldest first: ``run``, ``start_time``, ``end_time``, ``state``, ``exit_code``."""
    return conn.execute(
        """SELECT run, start_time, end_time, state, exit_code FROM job_runs
           WHERE cluster = %s AND job_id = %s ORDER BY run""",
        (cluster, job_id),
    ).fetchall()


def earlier_runs_s(runs: list[dict[str, Any]], latest_start: dt.datetime | None) -> float:
    """Seconds the earlier runs ran: each from its start to its end, else to the next run's start
    (its epilog never told). A run without a known start counts nothing."""
    total = 0.0
    if not runs:
        return total
    starts = [r["start_time"] for r in runs[1:]] + [latest_start]
    for run, next_start in zip(runs, starts, strict=True):
        end = run["end_time"] or next_start
        if run["start_time"] is not None and end is not None:
            total += max((end - run["start_time"]).total_seconds(), 0.0)
    return total
