"""Reading findings: a job's, the cluster's open ones, and open counts for the jobs list. The API
(``routes/findings.py``) and the dashboard read through here, so they show the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from jobsight.collector.store.db import Connection

STATES: Final = ("open", "resolved", "all")
_SEVERITY_ORDER: Final = "CASE f.severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END"
_COLUMNS: Final = ("f.id, f.cluster, f.job_id, f.rule, f.subject, f.rank, f.node, f.gpu, f.severity, f.state, "
                   "f.opened_at, f.updated_at, f.resolved_at, f.at_ts, f.title, f.message, f.evidence")


def job_findings(conn: Connection, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """The job's findings, open first (most severe first), then resolved, newest first."""
    return conn.execute(
        f"""SELECT {_COLUMNS} FROM findings f WHERE f.job_id = %s AND f.cluster = %s
            ORDER BY f.state = 'open' DESC, {_SEVERITY_ORDER}, f.opened_at DESC, f.id DESC""",
        (job_id, cluster),
    ).fetchall()


def list_findings(
    conn: Connection, *, state: str = "open", cluster: str | None = None, user: str | None = None,
    job_id: str | None = None, rule: str | None = None, limit: int = 200, offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """Findings across jobs with their job's user, account and partition (``attrs`` holds only
    ``process``, the owner of a run outside Slurm, for its user's name, as the jobs list has it);
    ``user`` limits them to that user's jobs. Returns the page and the total."""
    where, params = ["TRUE"], {}
    if state != "all":
        where.append("f.state = %(state)s")
        params["state"] = state
    for name, value in (("cluster", cluster), ("job_id", job_id), ("rule", rule)):
        if value is not None:
            where.append(f"f.{name} = %({name})s")
            params[name] = value
    if user is not None:
        where.append("j.user_name = %(user)s")
        params["user"] = user
    sql_where = " AND ".join(where)
    rows = conn.execute(
        f"""SELECT {_COLUMNS}, j.user_name, j.account, j.partition, j.name AS job_name, j.demo,
                   jsonb_build_object('process', j.attrs -> 'process') AS attrs
            FROM findings f LEFT JOIN jobs j ON j.job_id = f.job_id AND j.cluster = f.cluster
            WHERE {sql_where} ORDER BY {_SEVERITY_ORDER}, f.opened_at DESC, f.id DESC
            LIMIT %(limit)s OFFSET %(offset)s""",
        {**params, "limit": limit, "offset": offset},
    ).fetchall()
    total = conn.execute(
        f"""SELECT count(*) AS n FROM findings f LEFT JOIN jobs j ON j.job_id = f.job_id AND j.cluster = f.cluster
            WHERE {sql_where}""", params,
    ).fetchone()
    return rows, int(total["n"]) if total else 0


def open_by_job(conn: Connection, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The open findings (rule, severity, title) of each of ``keys`` (cluster, job_id)."""
    if not keys:
        return {}
    rows = conn.execute(
        f"""SELECT f.cluster, f.job_id, f.rule, f.severity, f.title FROM findings f
            JOIN unnest(%s::text[], %s::text[]) AS k(cluster, job_id) ON k.job_id = f.job_id AND k.cluster = f.cluster
            WHERE f.state = 'open' ORDER BY {_SEVERITY_ORDER}, f.opened_at""",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault((row["cluster"], row["job_id"]), []).append(row)
    return out
