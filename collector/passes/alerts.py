"""Alerts for health findings: the outbox rows a finding's transaction writes, and the sender.

``enqueue`` runs inside the transaction that opens or resolves a finding (collector/passes/findings.py)
and writes one ``alert_outbox`` row per sink that wants it: the alert is committed with the
finding or not at all, so a collector killed before sending finds it after the restart. The
unique (job, finding, event, sink) key makes a second enqueue of the same event a no-op.

``AlertSender`` runs in a thread of every collector process, outside any request. Per sink and
per pass it takes a transaction-level advisory lock (one process sends to a sink at a time),
claims the due rows ``FOR UPDATE SKIP LOCKED``, sends them as one message and marks them sent in
the same transaction; a failure counts the try and sets the next one after a doubling backoff.
A sink gets at most one message per ``group_window_s``, judged by the ``sent_at`` of its rows in
the database, so restarts and several processes keep the limit. The only way one alert can go
twice: the process dies after the sink took the message and before the commit (the window of a
single round trip); an alert is never lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool

from jobsight.collector.config.alertmanager import AlertmanagerSink
from jobsight.collector.config.alerts import AlertSettings
from jobsight.collector.passes.alert_messages import deliver, message
from jobsight.collector.passes.alertmanager import post_alerts
from jobsight.collector.store.db import Connection, DatabaseUnavailable, autocommit_connection, unavailable

log = logging.getLogger("jobsight.collector.passes.alerts")

EVENTS: Final = ("opened", "resolved")
SINK_LOCK_CLASS: Final = 0x616C7274
"""First key of the two-key advisory locks that serialise sending per sink (the two-key space
does not overlap the one-key locks of compaction and partitions)."""

_ENQUEUE = """
INSERT INTO alert_outbox (cluster, job_id, finding_id, event, sink)
SELECT %(cluster)s, %(job_id)s, %(finding_id)s, %(event)s, sink FROM unnest(%(sinks)s::text[]) AS sink
ON CONFLICT (job_id, finding_id, event, sink) DO NOTHING
"""

# Reads the partial index of unsent rows; rows past max_attempts were given up.
_DUE_SINKS = """
SELECT DISTINCT sink FROM alert_outbox
WHERE sent_at IS NULL AND next_try_at <= now() AND attempts < %(max_attempts)s
"""

_SENT_IN_WINDOW = """
SELECT EXISTS (SELECT 1 FROM alert_outbox WHERE sink = %(sink)s
               AND sent_at > clock_timestamp() - make_interval(secs => %(window)s))
"""

CLAIM: Final = """
SELECT o.job_id, o.id, o.cluster, o.finding_id, o.event, o.attempts,
       f.rule, f.subject, f.severity, f.title, f.message, f.opened_at, f.resolved_at, f.at_ts, j.user_name,
       j.name AS job_name
FROM alert_outbox o
LEFT JOIN findings f ON f.job_id = o.job_id AND f.id = o.finding_id
LEFT JOIN jobs j ON j.cluster = o.cluster AND j.job_id = o.job_id
WHERE o.sink = %(sink)s AND o.sent_at IS NULL AND o.next_try_at <= now() AND o.attempts < %(max_attempts)s
ORDER BY o.created_at, o.id
FOR UPDATE OF o SKIP LOCKED
"""

_MARK_SENT = """
UPDATE alert_outbox SET sent_at = clock_timestamp(), attempts = attempts + 1, last_error = NULL
WHERE (job_id, id) IN (SELECT * FROM unnest(%(job_ids)s::text[], %(ids)s::bigint[]))
"""

# The wait doubles from retry_base_s with each failed try (the exponent capped so that power()
# stays in range), up to retry_max_s.
_MARK_FAILED = """
UPDATE alert_outbox SET attempts = attempts + 1, last_error = %(error)s,
       next_try_at = clock_timestamp()
                     + make_interval(secs => least(%(max_s)s, %(base_s)s * power(2, least(attempts, 40))))
WHERE (job_id, id) IN (SELECT * FROM unnest(%(job_ids)s::text[], %(ids)s::bigint[]))
RETURNING job_id, finding_id, event, attempts
"""


Send = Callable[[list[dict[str, Any]]], tuple[str | None, str]]
"""Sends a sink's claimed rows: ``(None or why not, what went in words for the log)``."""


def enqueue(
    conn: Connection, settings: AlertSettings, finding: Mapping[str, Any], event: str, job: Mapping[str, Any]
) -> int:
    """Write the outbox rows of ``event`` ("opened" or "resolved") of ``finding`` (a ``findings``
    row) of ``job`` (``user_name``, ``account``, ``partition``; any may be ``None``), one per sink
    whose filter takes it, plus ``user:<name>`` when the job's user is told. Runs in the caller's
    transaction. Returns the rows written (0 for sinks that already have this event)."""
    if event not in EVENTS:
        raise ValueError(f"alert event must be one of {EVENTS}, not {event!r}")
    sinks = [sink.name for sink in settings.sinks if sink.matches(finding, job)]
    sinks += [am.sink for am in settings.alertmanagers if am.matches(finding, job)]
    user_sink = settings.user_sink(job.get("user_name"))
    if user_sink is not None:
        sinks.append(user_sink)
    if not sinks:
        return 0
    cursor = conn.execute(
        _ENQUEUE,
        {"cluster": finding["cluster"], "job_id": finding["job_id"], "finding_id": finding["id"], "event": event,
         "sinks": sinks},
    )
    return max(cursor.rowcount, 0)


class AlertSender:
    """Sends the outbox. ``source`` is the collector's pool (or, for a caller that has one, a
    connection in autocommit mode); ``dashboard_url`` (``CollectorSettings.dashboard_url``), when
    given, puts each job's page in the message."""

    def __init__(
        self,
        source: ConnectionPool[Connection] | Connection,
        settings: AlertSettings,
        dashboard_url: str | None = None,
    ):
        self.source = source
        self.settings = settings
        self.dashboard_url = dashboard_url

    @contextmanager
    def _connection(self, conn: Connection | None) -> Iterator[Connection]:
        given = conn if conn is not None else self.source
        if isinstance(given, ConnectionPool):
            with autocommit_connection(given) as pooled:
                yield pooled
            return
        if not given.autocommit:
            # Each sink's send is its own transaction: inside a caller's, they would be savepoints.
            raise ValueError("AlertSender needs a connection in autocommit mode")
        yield given

    def send_due(self, conn: Connection | None = None) -> int:
        """One pass: every configured sink with due alerts gets its message, unless it had one in
        the group window. Returns the outbox rows sent."""
        if not self.settings.can_send():
            return 0
        sent = 0
        with self._connection(conn) as db:
            for (sink,) in _rows(db, _DUE_SINKS, {"max_attempts": self.settings.max_attempts}):
                alertmanager = self.settings.alertmanager_of(sink)
                if alertmanager is not None:
                    # Alertmanager groups alerts itself: no window here, each row an alert.
                    sent += self._send_sink(db, sink, 0.0, self._alertmanager(alertmanager))
                    continue
                url = self.settings.url_of(sink)
                if url is not None:  # a sink since removed from the configuration: its rows wait
                    sent += self._send_sink(db, sink, self.settings.group_window_s,
                                            self._apprise(url.get_secret_value()))
        return sent

    def _alertmanager(self, target: AlertmanagerSink) -> Send:
        def send(rows: list[dict[str, Any]]) -> tuple[str | None, str]:
            return post_alerts(target, rows, self.dashboard_url), f"{len(rows)} alert(s)"
        return send

    def _apprise(self, url: str) -> Send:
        def send(rows: list[dict[str, Any]]) -> tuple[str | None, str]:
            composed = message(rows, self.dashboard_url)
            return deliver(url, composed), composed.title
        return send

    def _send_sink(self, db: Connection, sink: str, window_s: float, send: Send) -> int:
        """Claim ``sink``'s due rows and ``send`` them (unless it had a message in the last ``window_s``)."""
        settings = self.settings
        with db.transaction():
            locked = _rows(db, "SELECT pg_try_advisory_xact_lock(%(cls)s, hashtext(%(sink)s))",
                           {"cls": SINK_LOCK_CLASS, "sink": sink})
            if not locked[0][0]:
                return 0  # another collector process is sending to this sink right now
            if window_s > 0:
                if _rows(db, _SENT_IN_WINDOW, {"sink": sink, "window": window_s})[0][0]:
                    return 0  # this window's message went; what is due waits for the window to end
            with db.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(CLAIM, {"sink": sink, "max_attempts": settings.max_attempts}).fetchall()
            if not rows:
                return 0
            error, what = send(rows)
            keys = {"job_ids": [row["job_id"] for row in rows], "ids": [row["id"] for row in rows]}
            if error is None:
                db.execute(_MARK_SENT, keys)
                log.info("alert sent to sink %s: %s", sink, what)
                return len(rows)
            backoff = {"base_s": settings.retry_base_s, "max_s": settings.retry_max_s}
            failed = _rows(db, _MARK_FAILED, {**keys, **backoff, "error": error})
        log.warning("alert to sink %s not sent (%d findings): %s", sink, len(rows), error)
        for job_id, finding_id, event, attempts in failed:
            if attempts >= settings.max_attempts:
                # Logged here once: a row at max_attempts is never claimed again.
                log.error("alert given up after %d tries: sink %s, job %r, finding %s %s; last error: %s",
                          attempts, sink, job_id, finding_id, event, error)
        return 0

    def run(self, stop: threading.Event) -> None:
        """Send due alerts every ``poll_interval_s`` until ``stop`` is set (a thread's target)."""
        if not self.settings.can_send():
            log.debug("no alert sinks configured; the alert sender is idle")
            return
        keep_sending(self.send_due, self.settings.poll_interval_s, stop, "alert", log)


def keep_sending(send: Callable[[], int], poll_interval_s: float, stop: threading.Event, what: str,
                 logger: logging.Logger) -> None:
    """Call ``send`` every ``poll_interval_s`` until ``stop`` is set, outliving any failed pass (a
    sender thread's loop: the alerts' and the notices')."""
    while True:
        try:
            send()
        except DatabaseUnavailable as exc:
            # The outage is said once when it begins and once when it ends (store/db.py), not at
            # every pass that meets it.
            logger.debug("%s pass skipped, database unavailable: %s", what, exc)
        except psycopg.OperationalError as exc:
            logger.debug("%s pass skipped, database unavailable: %s", what, unavailable(exc))
        except Exception:  # boundary: the sender must outlive a bad pass; the next one retries
            logger.exception("%s pass failed", what)
        if stop.wait(poll_interval_s):
            return


def _rows(db: Connection, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Rows as tuples, whatever row factory the connection has (the pool's gives dicts)."""
    with db.cursor(row_factory=tuple_row) as cur:
        return cur.execute(sql, params).fetchall()
