"""Every link to a dashboard page, built in one place so that the dashboard, the alerts, the
collector's summary answer and ``jobsight report`` cannot drift apart.

The pages and what their address holds (everything else on a page is at its default):

- ``jobs`` — the jobs list, its filters as query parameters (the page names them);
- ``job?cluster=…&job=…&t=…`` — one job; ``t`` (:data:`MOMENT`), an ISO 8601 UTC time, opens the
  page scrolled to a view of every GPU and rank around that moment, the moment marked;
- ``audit?from=YYYY-MM-DD&to=YYYY-MM-DD`` — the audit of those UTC days, ``to`` included;
- ``attention`` — the admins' open findings.

A link is relative (``job?…``, as the dashboard's own tables hold them) when ``base`` is empty,
else absolute under ``base``, the dashboard's public URL (``JOBSIGHT_DASHBOARD_URL``).
Standard library only, like the rest of the protocol.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlencode

JOBS_PAGE: Final = "jobs"
JOB_PAGE: Final = "job"
AUDIT_PAGE: Final = "audit"
ATTENTION_PAGE: Final = "attention"

CLUSTER: Final = "cluster"
JOB: Final = "job"
MOMENT: Final = "t"
"""The job page's parameter holding the moment to show (ISO 8601, UTC)."""
FROM: Final = "from"
TO: Final = "to"
"""The audit's first and last day (UTC, both included)."""


def iso_moment(moment: dt.datetime) -> str:
    """``2024-03-04T10:00:00Z``: a moment as :data:`MOMENT` holds it (whole seconds, UTC; a naive
    time is taken as UTC)."""
    aware = moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)
    return aware.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_moment(text: str | None) -> dt.datetime | None:
    """The moment an ISO 8601 text names, in UTC (no zone: UTC); ``None`` when absent or not a
    time, as a hand-edited link may have it."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def parse_day(text: str | None) -> dt.date | None:
    """The UTC day a ``from``/``to`` parameter names: ``2024-03-04``, or a full time's UTC day;
    ``None`` when absent or not a day."""
    if not text:
        return None
    try:
        return dt.date.fromisoformat(text.strip())
    except ValueError:
        moment = parse_moment(text)
        return moment.date() if moment is not None else None


def finding_moment(at_ts: dt.datetime | str | None, opened_at: dt.datetime | str | None) -> dt.datetime | None:
    """The moment a finding points at: ``at_ts`` (a hung rank's last step) when it has one, else
    when it opened. Either may be a time or its ISO text (a JSON answer); ``None`` when neither is."""
    for value in (at_ts, opened_at):
        moment = parse_moment(value) if isinstance(value, str) else value
        if moment is not None:
            return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)
    return None


def page_link(page: str, query: Mapping[str, str | None], *, base: str = "") -> str:
    """``<base>/<page>?<query>``; parameters that are ``None`` or empty are left out, and colons
    stay readable (``t=2024-03-04T10:00:00Z``)."""
    kept = {name: value for name, value in query.items() if value}
    path = f"{base.rstrip('/')}/{page}" if base else page
    return f"{path}?{urlencode(kept, safe=':')}" if kept else path


def job_query(cluster: str, job_id: str, moment: dt.datetime | None = None) -> dict[str, str]:
    """The job page's query parameters; with ``moment``, the page opens at it."""
    query = {CLUSTER: cluster, JOB: job_id}
    if moment is not None:
        query[MOMENT] = iso_moment(moment)
    return query


def job_link(cluster: str, job_id: str, moment: dt.datetime | None = None, *, base: str = "") -> str:
    """The job's page, at ``moment`` when given."""
    return page_link(JOB_PAGE, job_query(cluster, job_id, moment), base=base)


def audit_query(first_day: dt.date, last_day: dt.date) -> dict[str, str]:
    """The audit page's query parameters for the UTC days ``first_day`` to ``last_day``, both included."""
    return {FROM: first_day.isoformat(), TO: last_day.isoformat()}


def audit_link(first_day: dt.date, last_day: dt.date, *, base: str = "") -> str:
    """The audit of the UTC days ``first_day`` to ``last_day``, both included."""
    return page_link(AUDIT_PAGE, audit_query(first_day, last_day), base=base)


def jobs_link(filters: Mapping[str, str | None] | None = None, *, base: str = "") -> str:
    """The jobs list with ``filters`` (the jobs page's parameter names), none by default."""
    return page_link(JOBS_PAGE, filters or {}, base=base)
