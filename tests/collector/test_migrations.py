"""Alembic owns the schema: up from empty, down again, and no autogenerate diff."""

from __future__ import annotations

import psycopg

from jobsight.collector.store import migrate


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p') AND relnamespace = 'public'::regnamespace"
        ).fetchall()
    return {r[0] for r in rows}


def test_upgrade_from_empty_then_downgrade(empty_database_url: str) -> None:
    assert migrate.current_revision(empty_database_url) is None
    migrate.upgrade(empty_database_url)
    assert migrate.schema_is_current(empty_database_url)
    expected = {
        "jobs", "gpu_samples", "host_samples", "log_events", "metrics", "steps", "profiles",
        "job_summaries", "ingest_batches", "profile_requests",
    }
    assert expected <= _tables(empty_database_url)
    migrate.downgrade(empty_database_url, "base")
    assert migrate.current_revision(empty_database_url) is None
    assert _tables(empty_database_url) == {"alembic_version"}


def test_autogenerate_finds_no_diff(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    assert migrate.autogenerate_diff(empty_database_url) == []


def test_time_series_tables_are_range_partitioned(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_get_partkeydef(c.oid) FROM pg_class c WHERE c.relkind = 'p'"
        ).fetchall()
    keys = dict(rows)
    for table in ("gpu_samples", "host_samples", "log_events", "metrics", "steps"):
        assert keys[table] == "RANGE (ts)"


def test_every_big_table_carries_the_job_id(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'job_id' AND table_schema = 'public'"
        ).fetchall()
    with_job = {r[0] for r in rows}
    assert {"gpu_samples", "host_samples", "log_events", "metrics", "steps", "profiles", "job_summaries"} <= with_job


def test_upgrade_keeps_rows_in_existing_partitions(empty_database_url: str) -> None:
    """A later migration runs over a database that already holds partitions and data."""
    migrate.upgrade(empty_database_url, "0001")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE steps_p20261122 PARTITION OF steps"
                     " FOR VALUES FROM ('2026-11-22 00:00+00') TO ('2026-11-23 00:00+00')")
        conn.execute("INSERT INTO steps (cluster, job_id, ts, step, duration_s)"
                     " VALUES ('c', 'j', '2026-11-22 12:00+00', 1, 0.02)")
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT step, tid FROM steps_p20261122").fetchall() == [(1, None)]
    assert migrate.autogenerate_diff(empty_database_url) == []
    migrate.downgrade(empty_database_url, "base")


def test_ledger_rows_from_before_senders_match_any_sender_and_go_back_down(empty_database_url: str) -> None:
    """0011 keys the ledger by sender; rows it finds get ``*`` (any sender: collector/ingest/write.py), and
    its downgrade keeps one row per batch id."""
    migrate.upgrade(empty_database_url, "0010")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO ingest_batches (source, seq, cluster, records) VALUES ('n1:1', 7, 'default', 3)")
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert conn.execute("SELECT source, sender, seq FROM ingest_batches").fetchall() == [("n1:1", "*", 7)]
        conn.execute("INSERT INTO ingest_batches (source, sender, seq, cluster, records) "
                      "VALUES ('n1:1', 'node:default/n1', 7, 'default', 3)")
    migrate.downgrade(empty_database_url, "0010")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert conn.execute("SELECT source, seq FROM ingest_batches").fetchall() == [("n1:1", 7)]


def test_unallocated_gpu_uses_come_with_0020_and_go_with_it(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url, "0020")
    assert "gpu_unallocated_uses" in _tables(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO gpu_unallocated_uses (cluster, node, ts, gpu_index, gpu_uuid, pid) "
                     "VALUES ('c', 'n1', now(), 3, 'GPU-3', 42)")
    migrate.downgrade(empty_database_url, "0019")
    assert "gpu_unallocated_uses" not in _tables(empty_database_url)
    migrate.upgrade(empty_database_url)
    assert migrate.autogenerate_diff(empty_database_url) == []
