"""Findings as Alertmanager alerts: the body of one ``POST /api/v2/alerts`` and its sending.

Each outbox row becomes one alert. Its labels (what Alertmanager routes, groups and silences on):
``alertname`` (``jobsight_<rule>``), ``severity``, ``cluster``, ``job``, ``user``, ``rule`` and
``subject`` (the rank, node or GPU the finding names: two findings of one rule in one job stay two
alerts). Its annotations: ``summary`` (the finding's title), ``description`` (its message),
``link`` (the job's page at the finding's moment, also the ``generatorURL``) and ``job_name``.
An opened finding fires from its opening until ``firing_for_s`` ahead (nobody re-sends it, so
Alertmanager's ``resolve_timeout`` must not end it); its resolve sets ``endsAt`` to when it resolved.

What a job or user sent (job id, user, job name, a finding's subject and message) is data: it is
sent as JSON string values, which Alertmanager keeps as they are (no label can be added or ended by
a value), with control and invisible characters as ``?`` and each cut to a short length, as the
other sinks do (:func:`jobsight.collector.passes.alert_messages.shown`).
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Final

from jobsight.collector.config.alertmanager import AlertmanagerSink
from jobsight.collector.passes.alert_messages import LIMITS, MAX_ERROR_CHARS, shown
from jobsight.rules import links

API_PATH: Final = "/api/v2/alerts"


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def alert_of(row: Mapping[str, Any], target: AlertmanagerSink, dashboard_url: str | None,
             now: dt.datetime) -> dict[str, Any]:
    """The alert of one outbox row joined with its finding and job (``alerts.CLAIM``)."""
    rule = str(row.get("rule") or "unknown")
    opened = row.get("opened_at") or now
    moment = links.finding_moment(row.get("at_ts"), row.get("opened_at"))
    link = links.job_link(row["cluster"], row["job_id"], moment, base=dashboard_url or "")
    if row["event"] == "resolved":
        ends = row.get("resolved_at") or now
    else:
        ends = now + dt.timedelta(seconds=target.firing_for_s)
    labels = {
        "alertname": f"jobsight_{rule}",
        "severity": shown(row.get("severity") or "info", LIMITS["word"]),
        "cluster": shown(row["cluster"], LIMITS["word"]),
        "job": shown(row["job_id"], LIMITS["job"]),
        "user": shown(row.get("user_name") or "", LIMITS["user"]),
        "rule": rule,
        "subject": shown(row.get("subject") or "", LIMITS["subject"]),
    }
    annotations = {
        "summary": shown(row.get("title") or "", LIMITS["title"]),
        "description": shown(row.get("message") or "", LIMITS["message"]),
        "link": link,
        "job_name": shown(row.get("job_name") or "", LIMITS["title"]),
    }
    alert: dict[str, Any] = {
        # An empty value is the same as no label to Alertmanager: left out, so the set is what it sees.
        "labels": {name: value for name, value in labels.items() if value},
        "annotations": {name: value for name, value in annotations.items() if value},
        "startsAt": _iso(opened),
        "endsAt": _iso(max(ends, opened)),
    }
    if link.startswith(("http://", "https://")):
        alert["generatorURL"] = link
    return alert


def post_alerts(target: AlertmanagerSink, rows: Sequence[Mapping[str, Any]], dashboard_url: str | None,
                now: dt.datetime | None = None) -> str | None:
    """Post ``rows`` as alerts, in their order (an open before its resolve). ``None`` when Alertmanager
    took them; else why not (its answer's status and first words, or the connection's error)."""
    moment = now or dt.datetime.now(dt.UTC)
    body = json.dumps([alert_of(row, target, dashboard_url, moment) for row in rows]).encode()
    request = urllib.request.Request(target.url + API_PATH, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=target.timeout_s) as response:  # noqa: S310 - an http(s) URL the settings checked
            response.read()
        return None
    except urllib.error.HTTPError as exc:
        said = exc.read(300).decode("utf-8", "replace")
        return f"Alertmanager answered {exc.code}: {said}"[:MAX_ERROR_CHARS]
    except (urllib.error.URLError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
