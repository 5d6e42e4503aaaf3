"""Notices to people, through the alerts' sinks: written to the ``notices`` outbox, sent by one sender.

``enqueue`` writes one row per recipient in the caller's transaction (the actions pass's step, the
reports pass's job end or period), keyed so that a second enqueue of the same notice is a no-op.
``NoticeSender`` runs in a thread of every collector process: it lists due rows, then claims each
by its key ``FOR UPDATE SKIP LOCKED`` (processes never send the same row), sends each through Apprise in the
markup of its sink, and marks it sent in the same transaction; a failure counts the try and sets the
next one after the alerts' doubling backoff (``retry_base_s`` .. ``retry_max_s``), up to
``max_attempts``. A recipient without an address is not enqueued: the step or report is still
recorded where it belongs (actions, the job's page), only the e-mail is missing.

Keys are per cluster (:func:`notice_key`): the same job id, or the same node name, in two clusters
is two notices. The outbox's unique index is ``(job_id, key, sink)``, so the cluster is part of the
key's text (percent-encoded: no cluster name can run into the parts after it). Keys written before
they held the cluster keep their meaning: a caller passes the key the same notice had then
(``legacy_key``), and a row under it *of the same cluster* (the row's ``cluster`` column) means the
notice was queued or sent already, so an upgrade resends nothing. A notice that such an old key made
a silent "duplicate" of another cluster's (the loss this fixes) is written, since that row is of the
other cluster.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import quote

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobsight.collector.config.alerts import USER_SINK_PREFIX, AlertSettings
from jobsight.collector.passes.alert_messages import Message, deliver
from jobsight.collector.passes.alerts import keep_sending
from jobsight.collector.passes.notice_messages import from_json, to_json
from jobsight.collector.store.db import Connection, autocommit_connection

log = logging.getLogger("jobsight.collector.passes.notices")

KINDS: Final = ("warning", "action", "job_end", "report", "suspect")

_ENQUEUE = """
INSERT INTO notices (cluster, job_id, kind, sink, key, title, lines, notify_type)
VALUES (%(cluster)s, %(job_id)s, %(kind)s, %(sink)s, %(key)s, %(title)s, %(lines)s, %(notify_type)s)
ON CONFLICT (job_id, key, sink) DO NOTHING
"""

# A row of the same notice under the key it had before keys held the cluster (see the module's docstring).
_QUEUED_BEFORE = """
SELECT EXISTS (SELECT 1 FROM notices
               WHERE job_id = %(job_id)s AND key = %(key)s AND sink = %(sink)s AND cluster = %(cluster)s) AS queued
"""

_DUE = """
SELECT job_id, id FROM notices
WHERE sent_at IS NULL AND next_try_at <= now() AND attempts < %(max_attempts)s
ORDER BY next_try_at, id
LIMIT %(limit)s
"""

# One row by its whole key: on Citus a single shard's query, where row locks are allowed (a locking read
# across shards is not); a row another process holds or has just sent is skipped.
_CLAIM = """
SELECT job_id, id, sink, kind, title, lines, notify_type FROM notices
WHERE job_id = %(job_id)s AND id = %(id)s AND sent_at IS NULL AND next_try_at <= now()
FOR UPDATE SKIP LOCKED
"""

_MARK_SENT = """UPDATE notices SET sent_at = clock_timestamp(), attempts = attempts + 1, last_error = NULL
                WHERE job_id = %(job_id)s AND id = %(id)s"""

# The alerts' backoff: doubling from retry_base_s, the exponent capped so that power() stays in range.
_MARK_FAILED = """
UPDATE notices SET attempts = attempts + 1, last_error = %(error)s,
       next_try_at = clock_timestamp()
                     + make_interval(secs => least(%(max_s)s, %(base_s)s * power(2, least(attempts, 40))))
WHERE job_id = %(job_id)s AND id = %(id)s
RETURNING attempts
"""

_GIVE_UP = """UPDATE notices SET attempts = %(max_attempts)s, last_error = %(error)s
              WHERE job_id = %(job_id)s AND id = %(id)s"""


def user_sink(settings: AlertSettings, user_name: str | None) -> str | None:
    """The sink name of ``user_name``'s notices; ``None`` when they have no address."""
    if user_name and settings.address_of(user_name) is not None:
        return USER_SINK_PREFIX + user_name
    return None


def notice_key(what: str, cluster: str, *parts: object) -> str:
    """The outbox key of a notice of ``cluster``: ``what`` (``job_end``, ``suspect``...), the cluster
    percent-encoded (it holds no ``:``), then ``parts``, ``:``-joined: ``job_end:default:0``."""
    return ":".join([what, quote(cluster, safe=""), *(str(part) for part in parts)])


def enqueue(conn: Connection | psycopg.Connection[Any], *, cluster: str, job_id: str, kind: str,
            sinks: Sequence[str | None], key: str, message: Message, legacy_key: str | None = None) -> int:
    """Write ``message`` for each sink (``None`` ones skipped) under ``key`` (:func:`notice_key`);
    returns the rows written (0 for sinks that already have it). ``legacy_key``: the key this notice
    had before keys held the cluster; a sink with a row of ``cluster`` under it is skipped (``None``:
    a notice that never had another key)."""
    if kind not in KINDS:
        raise ValueError(f"notice kind must be one of {KINDS}, not {kind!r}")
    written = 0
    for sink in dict.fromkeys(s for s in sinks if s):
        if legacy_key is not None and _queued_before(conn, cluster, job_id, legacy_key, sink):
            continue
        cursor = conn.execute(_ENQUEUE, {
            "cluster": cluster, "job_id": job_id, "kind": kind, "sink": sink, "key": key, "title": message.title,
            "lines": Jsonb(to_json(message)), "notify_type": message.kind})
        written += max(cursor.rowcount, 0)
    return written


def _queued_before(conn: Connection | psycopg.Connection[Any], cluster: str, job_id: str, key: str,
                   sink: str) -> bool:
    """Whether ``sink`` has a row of ``cluster`` under ``key``, a key of before keys held the cluster."""
    row = conn.execute(_QUEUED_BEFORE, {"cluster": cluster, "job_id": job_id, "key": key, "sink": sink}).fetchone()
    if row is None:
        return False
    return bool(row["queued"] if isinstance(row, dict) else row[0])


class NoticeSender:
    """Sends the notices outbox through the alerts' sinks and users' addresses."""

    def __init__(self, pool: ConnectionPool[Connection], settings: AlertSettings, poll_interval_s: float) -> None:
        self.pool = pool
        self.settings = settings
        self.poll_interval_s = poll_interval_s

    def send_due(self, limit: int = 100) -> int:
        """Send what is due, one notice per transaction, at most ``limit``; returns the notices sent."""
        sent = 0
        with autocommit_connection(self.pool) as db, db.cursor(row_factory=dict_row) as cur:
            due = cur.execute(_DUE, {"max_attempts": self.settings.max_attempts, "limit": limit}).fetchall()
            for keys in due:
                sent += self._send_one(db, {"job_id": keys["job_id"], "id": keys["id"]})
        return sent

    def _send_one(self, db: Connection, keys: dict[str, Any]) -> int:
        """1 when the notice went, else 0 (it failed, or another process has it)."""
        settings = self.settings
        with db.transaction(), db.cursor(row_factory=dict_row) as cur:
            row = cur.execute(_CLAIM, keys).fetchone()
            if row is None:
                return 0
            url = settings.url_of(row["sink"])
            if url is None:
                # The address was removed from the configuration since: given up at once, said once.
                gone = "no address for this recipient in the alerts' configuration"
                cur.execute(_GIVE_UP, {**keys, "error": gone, "max_attempts": settings.max_attempts})
                log.error("notice given up: %s to %s, job %r: %s", row["kind"], row["sink"], row["job_id"], gone)
                return 0
            error = deliver(url.get_secret_value(), from_json(row["title"], row["lines"], row["notify_type"]))
            if error is None:
                cur.execute(_MARK_SENT, keys)
                log.info("notice sent to %s: %s", row["sink"], row["title"])
                return 1
            backoff = {"base_s": settings.retry_base_s, "max_s": settings.retry_max_s}
            failed = cur.execute(_MARK_FAILED, {**keys, **backoff, "error": error}).fetchone()
        attempts = int(failed["attempts"]) if failed else 0
        log.warning("notice %s to %s not sent (try %d): %s", row["kind"], row["sink"], attempts, error)
        if attempts >= settings.max_attempts:
            log.error("notice given up after %d tries: %s to %s, job %r", attempts, row["kind"], row["sink"],
                      row["job_id"])
        return 0

    def run(self, stop: threading.Event) -> None:
        """Send due notices every ``poll_interval_s`` until ``stop`` is set (a thread's target)."""
        keep_sending(self.send_due, self.poll_interval_s, stop, "notice", log)
