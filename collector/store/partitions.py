"""Daily range partitions of the time-series tables: made ahead, made on demand for
late data (a spool replayed days later), dropped past the retention window. The packed
tier's tables (``PACKED_TABLES``) are partitioned by day too; their partitions are made by
the compaction pass for the day it packs, and dropped past their own retention (with
``gpu_hours``'s, see ``PACKED_RETENTION_TABLES``)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Collection, Iterable
from typing import Final

from psycopg import sql
from psycopg.rows import tuple_row

from jobsight.collector.store.db import Connection
from jobsight.collector.store.schema import PACKED_TABLES, PARTITIONED_TABLES, RETENTION_TABLES

log = logging.getLogger("jobsight.collector")

# Serialises partition DDL across collector processes sharing one database.
_DDL_LOCK_KEY = 0x6A6F6273


COMPANIONS: Final[dict[str, tuple[str, ...]]] = {"gpu_minutes": ("gpu_hours",)}
"""Tables whose partitions are made with another's. The hour rollup is written in the
transaction that writes the minute rollup, so a day that needs a gpu_minutes partition needs a
gpu_hours one: asking for the first (the ingest path, seeds, tests) makes both."""


def _with_companions(table: str) -> tuple[str, ...]:
    return (table, *COMPANIONS.get(table, ()))


def partition_name(table: str, day: dt.date) -> str:
    return f"{table}_p{day:%Y%m%d}"


class PartitionKeeper:
    """Remembers which daily partitions exist so the ingest path asks the database only
    when a batch brings a day it has not seen."""

    def __init__(self) -> None:
        self._known: set[tuple[str, dt.date]] = set()
        self._lock = threading.Lock()

    def load(self, conn: Connection) -> None:
        """Learn the partitions that exist (others may have been made by other processes)."""
        with self._lock:
            self._known.update(self._catalogue(conn))

    def reload(self, conn: Connection) -> None:
        """Forget what was known and read the catalogue again (partitions dropped elsewhere go)."""
        found = self._catalogue(conn)
        with self._lock:
            self._known = found

    @staticmethod
    def _catalogue(conn: Connection) -> set[tuple[str, dt.date]]:
        with conn.cursor(row_factory=tuple_row) as cur:
            rows = cur.execute(
                """SELECT parent.relname, child.relname FROM pg_inherits
                   JOIN pg_class parent ON parent.oid = pg_inherits.inhparent
                   JOIN pg_class child ON child.oid = pg_inherits.inhrelid
                   WHERE parent.relname = ANY(%(tables)s)""",
                {"tables": [*PARTITIONED_TABLES, *PACKED_TABLES]},
            ).fetchall()
        return {(parent, dt.datetime.strptime(child[-8:], "%Y%m%d").date()) for parent, child in rows}

    def exists(self, table: str, day: dt.date) -> bool:
        with self._lock:
            return (table, day) in self._known

    def days(self, table: str) -> list[dt.date]:
        """The days ``table`` has a partition for, oldest first."""
        with self._lock:
            return sorted(d for t, d in self._known if t == table)

    def missing(self, table: str, days: Iterable[dt.date]) -> list[dt.date]:
        """The days of ``days`` lacking a partition of ``table`` or of one of its :data:`COMPANIONS`."""
        return sorted({day for _, day in self._missing(table, days)})

    def _missing(self, table: str, days: Iterable[dt.date]) -> list[tuple[str, dt.date]]:
        tables = _with_companions(table)
        with self._lock:
            return sorted({(t, d) for d in days for t in tables if (t, d) not in self._known})

    def ensure(self, conn: Connection, table: str, days: Iterable[dt.date]) -> None:
        """Create the partitions of ``table`` (and of its :data:`COMPANIONS`) for ``days``;
        ``conn`` must be in autocommit."""
        wanted = self._missing(table, days)
        if not wanted:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK_KEY,))
            for parent, day in wanted:
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})"
                    ).format(
                        sql.Identifier(partition_name(parent, day)),
                        sql.Identifier(parent),
                        sql.Literal(f"{day.isoformat()} 00:00:00+00"),
                        sql.Literal(f"{(day + dt.timedelta(days=1)).isoformat()} 00:00:00+00"),
                    )
                )
        with self._lock:
            self._known.update(wanted)

    def ensure_ahead(self, conn: Connection, days_ahead: int, today: dt.date | None = None) -> None:
        today = today or dt.datetime.now(dt.UTC).date()
        days = [today + dt.timedelta(days=n) for n in range(-1, days_ahead + 1)]
        for table in PARTITIONED_TABLES:
            self.ensure(conn, table, days)

    def drop_older_than(
        self,
        conn: Connection,
        retention_days: int,
        today: dt.date | None = None,
        tables: Collection[str] = RETENTION_TABLES,
    ) -> list[str]:
        """Drop whole partitions of ``tables`` older than the retention window; returns their names.
        By default the tables kept for ``JOBSIGHT_RETENTION_DAYS``; the compaction pass drops the
        others (``PACKED_RETENTION_TABLES``) past the packed tier's retention."""
        if retention_days <= 0:
            return []
        today = today or dt.datetime.now(dt.UTC).date()
        cutoff = today - dt.timedelta(days=retention_days)
        with self._lock:
            old = sorted((t, d) for t, d in self._known if d < cutoff and t in tables)
        dropped: list[str] = []
        for table, day in old:
            name = partition_name(table, day)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK_KEY,))
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
            with self._lock:
                self._known.discard((table, day))
            dropped.append(name)
        if dropped:
            log.info("retention: dropped %d partitions older than %s", len(dropped), cutoff)
        return dropped

    def drop_if_empty(self, conn: Connection, table: str, day: dt.date) -> bool:
        """Drop the partition of ``table`` for ``day`` if it holds no rows; returns whether it is
        gone. ``conn`` must be in autocommit."""
        name = partition_name(table, day)
        with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%(key)s)", {"key": _DDL_LOCK_KEY})
            row = cur.execute("SELECT to_regclass(%(name)s) IS NOT NULL", {"name": name}).fetchone()
            empty = True  # a partition another process dropped is gone as well
            if row is not None and row[0]:
                # The lock keeps a late row from arriving between the look and the drop.
                cur.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(name)))
                found = cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(name))).fetchone()
                empty = found is not None and not found[0]
                if empty:
                    cur.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
        if empty:
            with self._lock:
                self._known.discard((table, day))
        return empty
