"""Work that one collector process does at a time, whatever ``--workers`` is: the health
evaluator, the reconciliation pass. :class:`LeaderTimer` holds a session advisory lock on a
connection of its own while it leads; the other processes try again each interval and take
over when the leader's connection goes (the server releases the lock with it)."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.rows import dict_row

R = TypeVar("R")

log = logging.getLogger("jobsight.collector.passes.leader")


class LeaderTimer(ABC, Generic[R]):
    """Runs :meth:`work` every ``interval_s`` while this process holds ``lock_key``."""

    def __init__(self, database_url: str, lock_key: int, name: str, interval_s: float) -> None:
        self.database_url = database_url
        self.lock_key = lock_key
        self.name = name
        self.interval_s = interval_s
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    @abstractmethod
    def work(self, conn: psycopg.Connection[dict[str, Any]]) -> R:
        """One pass, on the leader's connection (autocommit, rows as dicts)."""

    def describe(self, result: R) -> str | None:
        """A log line for what a pass did, ``None`` when there is nothing to say."""
        return None

    def _lead(self) -> psycopg.Connection[dict[str, Any]] | None:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        conn: psycopg.Connection[dict[str, Any]] = psycopg.connect(
            self.database_url, autocommit=True, row_factory=dict_row, application_name=f"jobsight-{self.name}")
        got = conn.execute("SELECT pg_try_advisory_lock(%s) AS got", (self.lock_key,)).fetchone()
        if not got or not got["got"]:
            conn.close()
            return None
        self._conn = conn
        return conn

    def tick(self) -> R | None:
        """One pass if this process leads (or can take the lead); ``None`` when another does."""
        conn = self._lead()
        if conn is None:
            return None
        try:
            return self.work(conn)
        except psycopg.OperationalError:
            # The connection (and with it the lead) is gone; the next tick tries again.
            conn.close()
            self._conn = None
            raise

    def run(self, stop: threading.Event) -> None:
        """Pass every ``interval_s`` until ``stop`` is set (a thread's target)."""
        while not stop.wait(self.interval_s):
            try:
                result = self.tick()
                line = None if result is None else self.describe(result)
                if line:
                    log.info("%s: %s", self.name, line)
            except Exception:  # boundary: a failed pass must not kill the collector; the next one retries
                log.exception("%s pass failed", self.name)
        if self._conn is not None:
            self._conn.close()
