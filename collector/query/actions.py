"""Reads of the steps waste policies took: a job's (its page, its API) and across the cluster (admins)."""

from __future__ import annotations

from typing import Any

from jobsight.collector.store.db import Connection

_COLUMNS = """a.id, a.cluster, a.job_id, a.finding_id, a.policy, a.rule, a.step, a.at, a.dry_run, a.outcome,
              a.detail, a.evidence"""


def job_actions(conn: Connection, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """The job's steps, oldest first: its timeline."""
    return conn.execute(
        f"SELECT {_COLUMNS} FROM actions a WHERE a.job_id = %s AND a.cluster = %s ORDER BY a.at, a.id",
        (job_id, cluster),
    ).fetchall()


def list_actions(conn: Connection, *, cluster: str | None = None, user: str | None = None,
                 account: str | None = None, step: str | None = None, limit: int = 200,
                 offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Steps across jobs, newest first, with their job's user and account; and how many match."""
    where = ["true"]
    params: dict[str, Any] = {}
    for column, value in (("a.cluster", cluster), ("j.user_name", user), ("j.account", account), ("a.step", step)):
        if value is not None:
            key = column.split(".")[1]
            where.append(f"{column} = %({key})s")
            params[key] = value
    base = f"""FROM actions a LEFT JOIN jobs j ON j.job_id = a.job_id AND j.cluster = a.cluster
               WHERE {' AND '.join(where)}"""
    total = conn.execute(f"SELECT count(*) AS n {base}", params).fetchone()
    rows = conn.execute(
        f"""SELECT {_COLUMNS}, j.user_name, j.account, j.partition, j.name AS job_name {base}
            ORDER BY a.at DESC, a.id DESC LIMIT %(limit)s OFFSET %(offset)s""",
        {**params, "limit": max(limit, 1), "offset": max(offset, 0)},
    ).fetchall()
    return rows, int(total["n"]) if total else 0
