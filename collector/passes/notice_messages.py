"""The words of the notices people get: a waste policy's warning and action, a job's end-of-job report,
the periodic report of a user or an account.

Each is an alert :class:`~jobsight.collector.passes.alert_messages.Message` (a title that needs no
escaping, lines of text and links), so the sender writes it in each sink's markup with the job's strings
escaped, as it writes alerts. Stored in ``notices`` as JSON (:func:`to_json`, :func:`from_json`): a
notice is composed once, when it is due, and sent as composed however long its sink is down.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Final

from jobsight.collector.passes.action_ladder import WARN, WARN_AGAIN, duration_words
from jobsight.collector.passes.alert_messages import LIMITS, Line, Link, Message, shown, title_safe
from jobsight.rules import links

_DOING: Final = {"cancel": "cancel it", "requeue": "requeue it (it goes back to the queue and starts again)"}
_DONE: Final = {"cancel": "cancelled", "requeue": "requeued"}


def to_json(message: Message) -> dict[str, Any]:
    """What ``notices`` stores of ``message``: its lines as lists of text and ``{"link": url}``."""
    return {"lines": [[{"link": piece.url} if isinstance(piece, Link) else piece for piece in line]
                      for line in message.lines]}


def from_json(title: str, stored: Mapping[str, Any], kind: str) -> Message:
    """The message a ``notices`` row holds."""
    lines: list[Line] = []
    for line in stored.get("lines") or []:
        lines.append(tuple(Link(str(piece["link"])) if isinstance(piece, dict) else str(piece) for piece in line))
    return Message(title, tuple(lines), kind)


def _job_link(job: Mapping[str, Any], dashboard_url: str | None) -> Line:
    if not dashboard_url:
        return ()
    return ("The job's page: ", Link(links.job_link(job["cluster"], job["job_id"], base=dashboard_url)))


def _job_words(job: Mapping[str, Any]) -> str:
    name = f" ({shown(job['name'], LIMITS['title'])})" if job.get("name") else ""
    where = f" on partition {shown(job['partition'], LIMITS['word'])}" if job.get("partition") else ""
    return f"Your job {shown(job['job_id'], LIMITS['job'])}{name}{where}"


def warning(job: Mapping[str, Any], *, policy: str, action: str, step: str, what: str, idle_s: float,
            act_at: dt.datetime, finding_message: str | None, dashboard_url: str | None) -> Message:
    """A policy's first or second warning (what it saw, what it will do and when), or a notify-only
    policy's last notice."""
    which = {WARN: "first warning", WARN_AGAIN: "second warning"}.get(step, "final notice")
    title = f"jobsight: job {title_safe(job['job_id'])}: {what} {duration_words(idle_s)} ({which})"
    lines: list[Line] = [(f"{_job_words(job)}: {what} for {duration_words(idle_s)} (policy {policy}).",)]
    if action in _DOING:
        lines.append((f"If this goes on, jobsight will {_DOING[action]} at {act_at:%Y-%m-%d %H:%M} UTC.",))
    else:
        lines.append(("This is a notice only: nothing will be done to the job.",))
    if finding_message:
        lines.append((shown(finding_message, LIMITS["message"]),))
    lines.append(("A job that needs its GPUs held while idle (a debugger, an interactive session) can ask "
                  "the admins for an exemption; a job that goes back to work starts the count again.",))
    link = _job_link(job, dashboard_url)
    return Message(title, tuple(lines + ([link] if link else [])), "warning")


def acted(job: Mapping[str, Any], *, action: str, reason: str, dashboard_url: str | None) -> Message:
    """The action went through: the job was cancelled or requeued, and why."""
    done = _DONE.get(action, action)
    title = f"jobsight: job {title_safe(job['job_id'])} {done}"
    lines: list[Line] = [(f"{_job_words(job)} was {done}: {shown(reason, LIMITS['message'])}.",)]
    link = _job_link(job, dashboard_url)
    return Message(title, tuple(lines + ([link] if link else [])), "failure" if action == "cancel" else "warning")


def job_end(job: Mapping[str, Any], state: str, report: str, dashboard_url: str | None) -> Message:
    """A job's end-of-job report: the text of ``jobsight report``, a line a line."""
    title = f"jobsight: job {title_safe(job['job_id'])} ended: {title_safe(state, LIMITS['word'])}"
    lines: list[Line] = [(line,) for line in report.rstrip("\n").splitlines()]
    link = _job_link(job, dashboard_url)
    return Message(title, tuple(lines + ([link] if link else [])), "info")


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def period_report(*, whom: str, label: str, totals: Mapping[str, Any], worst: Sequence[Mapping[str, Any]],
                  dashboard_url: str | None) -> Message:
    """A user's or an account's report for one period: totals, then the jobs that idled most."""
    title = f"jobsight: GPU report for {title_safe(whom, LIMITS['word'])}, {label}"
    util, energy = totals.get("mean_util"), totals.get("energy_kwh")
    lines: list[Line] = [
        (f"GPU use of {shown(whom, LIMITS['word'])}, {label}:",),
        (f"  Jobs: {totals.get('jobs', 0)}",),
        (f"  GPU-hours: {_hours(totals.get('gpu_hours'))}",),
        (f"  Mean GPU utilisation: {'-' if util is None else f'{util:.0f} %'}",),
        (f"  Idle GPU-hours: {_hours(totals.get('idle_gpu_hours'))}",),
        (f"  Energy of the GPUs: {'-' if energy is None else f'{energy:.2f} kWh'}",),
    ]
    node, co2e = totals.get("node_energy_kwh"), totals.get("co2e_kg")
    if node is not None:
        lines.append((f"  Energy of the rest of the nodes: {node:.2f} kWh",))
    if co2e is not None:
        lines.append((f"  Emissions: {co2e:.2f} kg CO2e",))
    if worst:
        lines.append(("The jobs that left most GPU-hours idle:",))
    for job in worst:
        head = (f"  {shown(job['job_id'], LIMITS['job'])}"
                + (f" ({shown(job['name'], LIMITS['title'])})" if job.get("name") else "")
                + f": {_hours(job.get('idle_gpu_hours'))} of {_hours(job.get('gpu_hours'))} GPU-hours idle ")
        lines.append((head, Link(links.job_link(job["cluster"], job["job_id"], base=dashboard_url)))
                     if dashboard_url else (head.rstrip(),))
    return Message(title, tuple(lines), "info")

