"""Reads of the steps waste policies took: a job's (its page, its API) and across the cluster (admins)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from jobsight.collector.store.db import Connection

_COLUMNS = """a.id, a.cluster, a.job_id, a.finding_id, a.policy, a.rule, a.step, a.at, a.dry_run, a.outcome,
              a.detail, a.evidence"""

_FROM = "FROM actions a LEFT JOIN jobs j ON j.job_id = a.job_id AND j.cluster = a.cluster"
"""Steps with their job's user and account; LEFT, so that a step whose job row is gone still shows."""

COUNT_GROUPS: Final = ("user_name", "account")
"""What :func:`action_counts` groups by: columns of ``jobs``, named here so no caller's text reaches the SQL."""

# Each count's condition. The policy's action (cancel or requeue) is only in the step's evidence; a step
# without it (none is written so today) counts as a cancel, the default a site would have meant.
_ACTION = "coalesce(a.evidence->>'action', 'cancel')"
_COUNTS: Final = {
    "warnings": "a.step IN ('warn', 'warn_again')",
    "cancelled": f"a.step = 'act' AND NOT a.dry_run AND a.outcome = 'done' AND {_ACTION} = 'cancel'",
    "requeued": f"a.step = 'act' AND NOT a.dry_run AND a.outcome = 'done' AND {_ACTION} = 'requeue'",
    "dry_run": f"a.step = 'act' AND a.dry_run AND {_ACTION} <> 'notify-only'",
    "notify_only": f"a.step = 'act' AND {_ACTION} = 'notify-only'",
    "held_back": "a.outcome = 'held_back'",
    "failed": "a.outcome = 'failed'",
    "exempt": "a.step = 'exempt'",
}
"""Per user or account: warnings given (first and second), jobs cancelled or requeued, actions a dry run
would have taken, final notices of notify-only policies, actions held back by the hourly cap or refused
by Slurm, and exemptions."""


def job_actions(conn: Connection, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """The job's steps, oldest first: its timeline."""
    return conn.execute(
        f"SELECT {_COLUMNS} FROM actions a WHERE a.job_id = %s AND a.cluster = %s ORDER BY a.at, a.id",
        (job_id, cluster),
    ).fetchall()


def _where(*, cluster: str | None, user: str | None, account: str | None, step: str | None = None,
           outcome: str | None = None, since: dt.datetime | None = None) -> tuple[str, dict[str, Any]]:
    """The WHERE clause of the filters that are set, and its parameters."""
    where = ["true"]
    params: dict[str, Any] = {}
    for column, value in (("a.cluster", cluster), ("j.user_name", user), ("j.account", account), ("a.step", step),
                          ("a.outcome", outcome)):
        if value is not None:
            key = column.split(".")[1]
            where.append(f"{column} = %({key})s")
            params[key] = value
    if since is not None:
        where.append("a.at >= %(since)s")
        params["since"] = since
    return " AND ".join(where), params


def list_actions(conn: Connection, *, cluster: str | None = None, user: str | None = None,
                 account: str | None = None, step: str | None = None, outcome: str | None = None,
                 since: dt.datetime | None = None, limit: int = 200,
                 offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Steps across jobs, newest first, with their job's user and account; and how many match.
    ``since`` keeps the steps taken at or after it."""
    clause, params = _where(cluster=cluster, user=user, account=account, step=step, outcome=outcome, since=since)
    base = f"{_FROM} WHERE {clause}"
    total = conn.execute(f"SELECT count(*) AS n {base}", params).fetchone()
    rows = conn.execute(
        f"""SELECT {_COLUMNS}, j.user_name, j.account, j.partition, j.name AS job_name {base}
            ORDER BY a.at DESC, a.id DESC LIMIT %(limit)s OFFSET %(offset)s""",
        {**params, "limit": max(limit, 1), "offset": max(offset, 0)},
    ).fetchall()
    return rows, int(total["n"]) if total else 0


def action_counts(conn: Connection, group: str, *, cluster: str | None = None, user: str | None = None,
                  account: str | None = None, since: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Per user (``group="user_name"``) or account: ``name``, the ``jobs`` with any step, then one count
    per kind of step (:data:`_COUNTS`). The most acted on first, then the most warned, then by name;
    the steps of a job the collector has no row for count under ``name`` ``None``."""
    if group not in COUNT_GROUPS:
        raise ValueError(f"cannot count actions by {group!r}: one of {', '.join(COUNT_GROUPS)}")
    clause, params = _where(cluster=cluster, user=user, account=account, since=since)
    counts = ",\n".join(f"count(*) FILTER (WHERE {condition}) AS {name}" for name, condition in _COUNTS.items())
    return conn.execute(
        # A subquery: ORDER BY may name an output column alone, not in an expression (cancelled + requeued).
        f"""SELECT * FROM (
                SELECT j.{group} AS name, count(DISTINCT (a.cluster, a.job_id)) AS jobs, {counts}
                {_FROM} WHERE {clause}
                GROUP BY j.{group}) c
            ORDER BY c.cancelled + c.requeued DESC, c.warnings DESC, c.name NULLS LAST""",
        params,
    ).fetchall()
