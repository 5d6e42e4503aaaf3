"""What an alert message says, and how it leaves: the one Apprise call, with its log kept in.

A message covers every outbox row that went due for one sink in one group window: a title with
the counts and one line per finding, each ending with the link to its job's page at the moment
the finding points at (:mod:`jobsight.protocol.links`). Apprise is told nothing but the URL,
title and body; what it logs is held back from the application's log (it names hosts and, at
times, whole URLs) and kept only as the reason of a failure, with every part of the URL taken out.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

from jobsight.collector.alert_settings import quiet_apprise_logging
from jobsight.protocol import links

MAX_LINES = 50
"""Findings named in one message; a cluster-wide event lists the first ones and a count."""
MAX_ERROR_CHARS = 500


def _findings(count: int) -> str:
    return f"{count} finding{'' if count == 1 else 's'}"


def _counts(rows: Sequence[Mapping[str, Any]]) -> str:
    """``3 findings opened, 1 resolved``; ``2 findings resolved``."""
    opened = sum(1 for row in rows if row["event"] == "opened")
    resolved = len(rows) - opened
    if not opened:
        return f"{_findings(resolved)} resolved"
    return f"{_findings(opened)} opened" + (f", {resolved} resolved" if resolved else "")


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value is not None else "?"


def _line(row: Mapping[str, Any], dashboard_url: str | None) -> str:
    who = f" ({row['user_name']})" if row.get("user_name") else ""
    head = f"{row['event'].upper()} job {row['job_id']}{who}"
    if row.get("rule") is None:
        # The finding row is gone (retention): the alert still says which one it was.
        return f"{head}: finding {row['finding_id']} (no longer stored)"
    subject = f" {row['subject']}" if row.get("subject") else ""
    if row["event"] == "opened":
        text = f"[{row['severity']}] {row['rule']}{subject}: {row['message']}"
    else:
        text = f"{row['rule']}{subject}: {row['title']} (open since {_when(row.get('opened_at'))})"
    if not dashboard_url:
        return f"{head} {text}"
    moment = links.finding_moment(row.get("at_ts"), row.get("opened_at"))
    return f"{head} {text} {links.job_link(row['cluster'], row['job_id'], moment, base=dashboard_url)}"


def compose(rows: Sequence[Mapping[str, Any]], dashboard_url: str | None = None) -> tuple[str, str, str]:
    """Title, body and Apprise notify type (``failure``, ``warning``, ``info``, ``success``) of one
    message for ``rows``: outbox rows joined with their finding and job (see alerts.CLAIM)."""
    if len(rows) == 1 and rows[0].get("title"):
        row = rows[0]
        title = f"jobsight: {row['event']} on job {row['job_id']}: {row['title']}"
    else:
        title = f"jobsight: {_counts(rows)}"
    lines = [_line(row, dashboard_url) for row in rows[:MAX_LINES]]
    if len(rows) > MAX_LINES:
        lines.append(f"... and {len(rows) - MAX_LINES} more")
    severities = {row.get("severity") for row in rows if row["event"] == "opened"}
    if "critical" in severities:
        kind = "failure"
    elif "warning" in severities:
        kind = "warning"
    else:
        kind = "info" if severities else "success"
    return title, "\n".join(lines), kind


def redact(text: str, url: str) -> str:
    """``text`` without the URL or any part of it (host, user, password, path words, query
    values), raw or percent-decoded: Apprise's messages and a plugin's exceptions may quote them.
    Query keys (``to``, ``from``) are no secret and stay."""
    scheme, _, rest = url.partition("://")
    location, _, query = rest.partition("?")
    pieces = re.split(r"[/:@#,;+\s]+", location)
    for _, value in parse_qsl(query, keep_blank_values=False):
        pieces += [value, *re.split(r"[/:@,;+\s]+", value)]
    parts = {url, rest, unquote(url), unquote(rest)}
    for piece in pieces:
        parts.update({piece, unquote(piece)})
    for part in sorted((p for p in parts if len(p) >= 3 and p != scheme), key=len, reverse=True):
        text = text.replace(part, "[sink]")
    return text


class _AppriseSaid(logging.Handler):
    """Keeps what Apprise logs at warning and above while one delivery runs (Apprise may log
    from its own threads, so this is not per thread: deliveries take turns instead)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except (TypeError, ValueError):  # a malformed log call inside Apprise must not fail the send
            self.lines.append(str(record.msg))


class _WhileDelivering(logging.Filter):
    """Drops urllib3's connection lines while a delivery runs: at debug level they give the
    sink's host, port and path (a Slack or Teams webhook's path is its credential)."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.active


_said = _AppriseSaid()
_quiet_urllib3 = _WhileDelivering()
_delivery_turn = threading.Lock()
_URLLIB3_LOGGER = "urllib3.connectionpool"


def deliver(url: str, title: str, body: str, kind: str) -> str | None:
    """Send one message through Apprise. ``None`` when it went; else why not, without the URL."""
    import apprise  # the collector extra has it; imported here so the collector starts without loading it

    logger = quiet_apprise_logging()
    with _delivery_turn:
        logger.setLevel(logging.WARNING)
        if _said not in logger.handlers:
            logger.addHandler(_said)
        _said.lines = []
        urllib3_log = logging.getLogger(_URLLIB3_LOGGER)
        if _quiet_urllib3 not in urllib3_log.filters:
            urllib3_log.addFilter(_quiet_urllib3)
        _quiet_urllib3.active = True
        try:
            sender = apprise.Apprise()
            if not sender.add(url):
                return "the sink's URL is not one this Apprise can send to"
            if sender.notify(title=title, body=body, notify_type=apprise.NotifyType(kind)):
                return None
            reason = "; ".join(_said.lines) or "Apprise reported the message not delivered"
        except Exception as exc:  # noqa: BLE001 - boundary: a plugin's own error is the sink's failure, not the sender's
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            _quiet_urllib3.active = False
            logger.removeHandler(_said)
    return redact(reason, url)[:MAX_ERROR_CHARS]
