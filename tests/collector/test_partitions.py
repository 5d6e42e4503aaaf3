"""Daily partitions: made ahead, made on demand for late data, dropped past retention."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsight.collector.store import migrate
from jobsight.collector.store.partitions import PartitionKeeper, partition_name


def _partitions(conn: psycopg.Connection[Any], table: str) -> set[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s", (table,)
    ).fetchall()
    return {str(r["relname"]) for r in rows}


def test_ahead_on_demand_and_retention(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    today = dt.date(2026, 11, 22)
    keeper = PartitionKeeper()
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        keeper.ensure_ahead(conn, days_ahead=2, today=today)
        expected = {partition_name("metrics", today + dt.timedelta(days=n)) for n in range(-1, 3)}
        assert _partitions(conn, "metrics") == expected

        late = today - dt.timedelta(days=200)
        keeper.ensure(conn, "metrics", [late])
        conn.execute("INSERT INTO metrics (cluster, job_id, ts, name, value) VALUES ('c', 'j', %s, 'loss', 1)",
                     (dt.datetime.combine(late, dt.time(12), dt.UTC),))
        assert partition_name("metrics", late) in _partitions(conn, "metrics")

        # A second keeper (another collector process) learns what exists from the catalogue.
        other = PartitionKeeper()
        other.load(conn)
        assert other.missing("metrics", [late, today]) == []

        dropped = other.drop_older_than(conn, retention_days=180, today=today)
        assert partition_name("metrics", late) in dropped
        assert partition_name("metrics", late) not in _partitions(conn, "metrics")
        assert expected <= _partitions(conn, "metrics")
        assert conn.execute("SELECT count(*) AS n FROM metrics").fetchone() == {"n": 0}
        assert other.drop_older_than(conn, retention_days=0, today=today) == []
