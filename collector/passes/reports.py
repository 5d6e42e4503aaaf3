"""The reports people get without asking each time: a job's efficiency report when it ends, and a
report per user and per account sponsor for each closed week or month. One leader writes them to the
notices outbox (collector/passes/notices.py), keyed so that a restart or a second process writes
none twice.

Job-end reports follow the jobs whose summary was stored since the last pass (a day back after a
start): the text is ``jobsight report``'s, from the same rows. A periodic report covers the jobs that
ended in the period: GPU-hours, mean utilisation (weighted by GPU-hours), idle GPU-hours (each job's
GPU-hours times the share of its samples under the idle threshold, as its summary counted them),
energy, and the jobs that left most GPU-hours idle, with links to their pages.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg

from jobsight.collector.config.alerts import AlertSettings
from jobsight.collector.config.notices import NoticeSettings
from jobsight.collector.passes import notice_messages, notices
from jobsight.collector.passes.alert_messages import LIMITS, shown
from jobsight.collector.passes.leader import LeaderTimer
from jobsight.collector.query.carbon_intensity import CarbonIntensity
from jobsight.collector.query.findings import job_findings
from jobsight.collector.query.job_energy import job_energy
from jobsight.rules import job_states, links
from jobsight.rules.report_text import format_report

REPORTS_LOCK_KEY: Final = 0x6A6F6273_72707473 & 0x7FFFFFFFFFFFFFFF
"""Session advisory lock held by the one process writing reports."""
FIRST_LOOK_BACK: Final = dt.timedelta(days=1)
"""How far back a starting leader looks for ended jobs (their reports, if written, are not written again)."""

_ENDED_SINCE = """
SELECT j.*, s.summary, s.computed_at FROM job_summaries s
JOIN jobs j ON j.cluster = s.cluster AND j.job_id = s.job_id
WHERE s.computed_at > %(since)s AND j.state <> 'running'
ORDER BY s.computed_at
"""

_ENDED_IN = """
SELECT j.cluster, j.job_id, j.user_name, j.account, j.name, s.gpu_hours, s.mean_util, s.energy_kwh,
       s.node_energy_kwh, s.co2e_kg,
       (SELECT avg((g->>'idle_fraction')::float8) FROM jsonb_array_elements(s.summary->'gpus') g) AS idle_fraction
FROM jobs j JOIN job_summaries s ON s.cluster = j.cluster AND s.job_id = j.job_id
WHERE j.end_time >= %(start)s AND j.end_time < %(end)s
"""

# A job's user-supplied strings, as a message shows them: the report text is not escaped line by line
# (its links must stay whole), so these are bounded and cleaned before it is written.
_JOB_STRINGS: Final = {"name": "title", "user_name": "user", "account": "word", "partition": "word"}


@dataclass
class ReportPass:
    """What one pass wrote: job-end reports and periodic reports, as notices."""

    job_end: list[str] = field(default_factory=list)
    periodic: list[str] = field(default_factory=list)


def closed_period(kind: str, now: dt.datetime) -> tuple[dt.datetime, dt.datetime, str]:
    """The last closed week (Monday to Monday, UTC) or month before ``now``: start, end and its label."""
    today = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == "weekly":
        end = today - dt.timedelta(days=today.weekday())
        start = end - dt.timedelta(days=7)
        return start, end, f"the week of {start:%Y-%m-%d}"
    end = today.replace(day=1)
    start = (end - dt.timedelta(days=1)).replace(day=1)
    return start, end, f"{start:%B %Y}"


def _plain_json(value: Any) -> Any:
    """Rows as the API's JSON gives them (times as ISO strings), which the report text reads."""
    return json.loads(json.dumps(value, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v)))


def job_end_report(conn: psycopg.Connection[dict[str, Any]], row: Mapping[str, Any],
                   dashboard_url: str | None, carbon: CarbonIntensity | None = None) -> str:
    """``jobsight report``'s text for an ended job from its row (with ``summary``) in ``jobs``."""
    job = {k: v for k, v in row.items() if k not in ("summary", "computed_at")}
    for key, limit in _JOB_STRINGS.items():
        if job.get(key):
            job[key] = shown(job[key], LIMITS[limit])
    answer = {"cluster": row["cluster"], "job_id": row["job_id"], "final": True, "summary": row["summary"],
              "findings": job_findings(conn, row["cluster"], row["job_id"]),
              "dashboard_url": links.job_link(row["cluster"], row["job_id"], base=dashboard_url)
              if dashboard_url else None,
              "dashboard_base_url": dashboard_url}
    if carbon is not None:
        answer["energy"] = job_energy(conn, row["cluster"], row["job_id"], carbon, {"summary": row["summary"]})
    return format_report(_plain_json(job), _plain_json(answer))


def _totals(jobs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    rows = list(jobs)
    hours = sum(r["gpu_hours"] or 0.0 for r in rows)
    weighted = [(r["mean_util"], r["gpu_hours"] or 0.0) for r in rows if r["mean_util"] is not None]
    weight = sum(w for _, w in weighted)
    energy = [r["energy_kwh"] for r in rows if r["energy_kwh"] is not None]
    node = [r["node_energy_kwh"] for r in rows if r.get("node_energy_kwh") is not None]
    co2e = [r["co2e_kg"] for r in rows if r.get("co2e_kg") is not None]
    return {"jobs": len(rows), "gpu_hours": hours,
            "mean_util": sum(u * w for u, w in weighted) / weight if weight else None,
            "idle_gpu_hours": sum(r["idle_gpu_hours"] for r in rows),
            "energy_kwh": sum(energy) if energy else None,
            "node_energy_kwh": sum(node) if node else None,
            "co2e_kg": sum(co2e) if co2e else None}


class Reports:
    """Writes the reports due, as notices, on a connection the caller holds."""

    def __init__(self, settings: NoticeSettings, alerts: AlertSettings, dashboard_url: str | None = None,
                 carbon: CarbonIntensity | None = None) -> None:
        self.settings = settings
        self.carbon = carbon
        """The site's carbon intensity: the job-end report's whole energy and emissions (``None``: GPUs'
        energy alone)."""
        self.alerts = alerts
        self.dashboard_url = dashboard_url
        self.since: dt.datetime | None = None
        self.reported: dt.datetime | None = None
        """The start of the last period whose reports this leader wrote."""

    def run_once(self, conn: psycopg.Connection[dict[str, Any]], now: dt.datetime | None = None) -> ReportPass:
        if now is None:
            now = conn.execute("SELECT now() AS now").fetchone()["now"]  # type: ignore[index]
        result = ReportPass()
        if self.settings.job_end_summary != "off":
            result.job_end = self.job_end_reports(conn, now)
        if self.settings.report_period != "off":
            result.periodic = self.periodic_reports(conn, now)
        return result

    def _wants_job_end(self, user: str | None) -> bool:
        return self.settings.job_end_summary == "all" or user in self.settings.job_end_users

    def job_end_reports(self, conn: psycopg.Connection[dict[str, Any]], now: dt.datetime) -> list[str]:
        since = self.since if self.since is not None else now - FIRST_LOOK_BACK
        written = []
        for row in conn.execute(_ENDED_SINCE, {"since": since}).fetchall():
            since = max(since, row["computed_at"])
            sink = notices.user_sink(self.alerts, row["user_name"])
            if sink is None or not self._wants_job_end(row["user_name"]):
                continue
            state = job_states.describe(row["state"], row["exit_code"])
            message = notice_messages.job_end(row, state, job_end_report(conn, row, self.dashboard_url, self.carbon),
                                              self.dashboard_url)
            run = row.get("run") or 0
            if notices.enqueue(conn, cluster=row["cluster"], job_id=row["job_id"], kind="job_end", sinks=[sink],
                               key=notices.notice_key("job_end", row["cluster"], run), legacy_key=f"job_end:{run}",
                               message=message):
                written.append(row["job_id"])
        self.since = since
        return written

    def periodic_reports(self, conn: psycopg.Connection[dict[str, Any]], now: dt.datetime) -> list[str]:
        start, end, label = closed_period(self.settings.report_period, now)
        if self.reported == start:
            return []
        jobs = []
        for row in conn.execute(_ENDED_IN, {"start": start, "end": end}).fetchall():
            idle = (row["gpu_hours"] or 0.0) * (row["idle_fraction"] or 0.0)
            jobs.append({**row, "idle_gpu_hours": idle})
        written = []
        audiences: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for job in jobs:
            if job["user_name"]:
                audiences.setdefault(("user", job["user_name"]), []).append(job)
            if job["account"] in self.settings.account_sponsors:
                audiences.setdefault(("account", job["account"]), []).append(job)
        for (what, whom), theirs in sorted(audiences.items()):
            readers = [whom] if what == "user" else self.settings.account_sponsors[whom]
            sinks = [notices.user_sink(self.alerts, reader) for reader in readers]
            if not any(sinks):
                continue
            worst = sorted((j for j in theirs if j["idle_gpu_hours"] > 0), key=lambda j: -j["idle_gpu_hours"])
            message = notice_messages.period_report(
                whom=whom if what == "user" else f"account {whom}", label=label, totals=_totals(theirs),
                worst=worst[:self.settings.worst_jobs], dashboard_url=self.dashboard_url)
            # One report per person and period across every cluster this collector serves (as the address
            # book is one per user name), so its key names the audience, not a cluster: nothing collides.
            if notices.enqueue(conn, cluster=theirs[0]["cluster"], job_id="", kind="report", sinks=sinks,
                               key=f"report:{self.settings.report_period}:{start:%Y-%m-%d}:{what}:{whom}",
                               message=message):
                written.append(f"{what} {whom}")
        self.reported = start
        return written


class ReportTimer(LeaderTimer[ReportPass]):
    """The timer: writes reports while this process leads (:data:`REPORTS_LOCK_KEY`)."""

    def __init__(self, database_url: str, reports: Reports) -> None:
        super().__init__(database_url, REPORTS_LOCK_KEY, "reports", reports.settings.interval_s)
        self.reports = reports

    def work(self, conn: psycopg.Connection[dict[str, Any]]) -> ReportPass:
        return self.reports.run_once(conn)

    def describe(self, result: ReportPass) -> str | None:
        if not result.job_end and not result.periodic:
            return None
        return f"{len(result.job_end)} job-end reports, {len(result.periodic)} periodic reports written"
