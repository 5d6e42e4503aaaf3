"""Every pooled connection (the collector's two pools, the dashboard's reads) works in UTC, whatever the
database's own TimeZone, and keeps the ``options`` its address gives."""

from __future__ import annotations

import datetime as dt

import psycopg

from jobsight.collector.store.db import INGEST_POOL, READ_POOL, open_pool, unit_of_work


def test_a_pool_session_is_in_utc_where_the_database_is_not(empty_database_url: str) -> None:
    """A database set to a half-hour zone: a plain connection reads its times there (so the test can
    fail), a pool's connection in UTC, with times psycopg loads as ``datetime.timezone.utc`` (what
    pandas turns into a time column fastest) and hours that are UTC's."""
    name = empty_database_url.rsplit("/", 1)[1]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET timezone = \'Asia/Kolkata\'')
    moment = dt.datetime(2026, 11, 28, 12, 45, tzinfo=dt.UTC)
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SHOW TimeZone").fetchone() == ("Asia/Kolkata",)
    pool = open_pool(empty_database_url, 1, statement_timeout_s=2)
    try:
        with unit_of_work(pool) as conn:
            assert conn.execute("SHOW TimeZone").fetchone() == {"TimeZone": "UTC"}
            row = conn.execute("SELECT %(t)s::timestamptz AS t, date_trunc('hour', %(t)s::timestamptz) AS hour",
                               {"t": moment}).fetchone()
            assert row is not None
            assert row["t"] == moment and row["t"].tzinfo is dt.UTC
            assert row["hour"] == dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC)
            assert conn.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "2s"}
    finally:
        pool.close()


def test_a_pool_keeps_the_options_of_its_address(empty_database_url: str) -> None:
    """A site's own ``options`` in the database address still apply beside the pool's two."""
    pool = open_pool(f"{empty_database_url}?options=-c%20work_mem%3D7MB", 1, statement_timeout_s=3)
    try:
        with unit_of_work(pool) as conn:
            assert conn.execute("SHOW work_mem").fetchone() == {"work_mem": "7MB"}
            assert conn.execute("SHOW TimeZone").fetchone() == {"TimeZone": "UTC"}
            assert conn.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "3s"}
    finally:
        pool.close()


def test_the_read_pool_never_prepares_a_statement(empty_database_url: str) -> None:
    """A read run again and again on a read connection is planned for its own parameters each time (no
    prepared statement, no generic plan); the ingest pool's connections prepare theirs as psycopg does."""
    statement = "SELECT count(*) AS n FROM generate_series(1, %(n)s)"
    for name, prepared in ((READ_POOL, 0), (INGEST_POOL, 1)):
        pool = open_pool(empty_database_url, 1, name=name)
        try:
            with unit_of_work(pool) as conn:
                for n in range(10):
                    assert conn.execute(statement, {"n": n}).fetchone() == {"n": n}
                found = conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()
                assert found == {"n": prepared}, name
        finally:
            pool.close()
