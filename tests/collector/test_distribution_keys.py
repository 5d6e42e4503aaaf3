"""The schema stays ready to be distributed by job id (Citus; docs/scale.md).

Citus accepts a primary key, unique constraint or unique index on a distributed table only
when it contains the distribution column: uniqueness is then checked inside one shard. So
every such key of every table with a ``job_id`` column must contain ``job_id``, apart from the
tables named below with the reason. The check reads the migrated database's catalogue, so a
key added by a migration is held to it too; it is also run on a hand-made key list with a
violation, to show that it can fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from jobsight.collector.store import citus

DISTRIBUTION_COLUMN = "job_id"

# Tables with a job_id column whose keys may lack it, each with the reason.
KEY_EXCEPTIONS: dict[str, str] = {}

# Tables without a job_id column, each with how it is placed on Citus: the lists that
# ``jobsight migrate --citus`` places them by (collector/store/citus.py), so a new table must be named there.
NOT_BY_JOB: dict[str, str] = {
    **{table: f"distributed by {column}" for table, column in citus.BY_SOURCE.items()},
    **{table: f"a reference table: {why}" for table, why in citus.REFERENCE_TABLES.items()},
    **{table: f"local on the coordinator: {why}" for table, why in citus.LOCAL_TABLES.items()},
}


@dataclass(frozen=True)
class Key:
    table: str
    name: str
    columns: tuple[str | None, ...]
    """Its columns in order; ``None`` for an expression."""


def tables_with_column(conn: psycopg.Connection[Any], column: str, schema: str = "public") -> set[str]:
    """Tables of ``schema`` with ``column``: partitioned parents included, their partitions
    not (a partition's keys are its parent's, and Citus distributes the parent)."""
    rows = conn.execute(
        """SELECT c.relname FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = %s AND NOT a.attisdropped
           WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition""",
        (column, schema),
    ).fetchall()
    return {row[0] for row in rows}


def all_tables(conn: psycopg.Connection[Any], schema: str = "public") -> set[str]:
    rows = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition""",
        (schema,),
    ).fetchall()
    return {row[0] for row in rows}


def unique_keys(conn: psycopg.Connection[Any], tables: set[str], schema: str = "public") -> list[Key]:
    """Every unique index of ``tables``: primary keys and unique constraints are unique indexes too."""
    rows = conn.execute(
        """SELECT t.relname, i.relname,
                  array(SELECT a.attname FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
                        LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
                        ORDER BY k.ord)
           FROM pg_index x
           JOIN pg_class t ON t.oid = x.indrelid
           JOIN pg_class i ON i.oid = x.indexrelid
           JOIN pg_namespace n ON n.oid = t.relnamespace
           WHERE n.nspname = %s AND x.indisunique AND t.relname = ANY(%s)
           ORDER BY t.relname, i.relname""",
        (schema, sorted(tables)),
    ).fetchall()
    return [Key(table, name, tuple(columns)) for table, name, columns in rows]


def keys_without(keys: list[Key], column: str, exceptions: dict[str, str]) -> list[str]:
    """The keys that do not contain ``column`` as a plain column, outside the excepted tables."""
    return [
        f"{key.table}.{key.name} ({', '.join(c or '<expression>' for c in key.columns)})"
        for key in keys
        if key.table not in exceptions and column not in key.columns
    ]


def test_every_key_of_a_job_table_contains_job_id(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        tables = tables_with_column(conn, DISTRIBUTION_COLUMN)
        keys = unique_keys(conn, tables)
    # The check saw the tables it is about (an empty catalogue query would pass anything).
    assert {"jobs", "gpu_samples", "gpu_minutes", "job_summaries", "profiles"} <= tables
    assert any(key.table == "gpu_minutes" for key in keys) and any(key.table == "jobs" for key in keys)
    assert keys_without(keys, DISTRIBUTION_COLUMN, KEY_EXCEPTIONS) == []


def test_the_exceptions_are_still_needed(database_url: str) -> None:
    """An exception that no longer breaks the rule (fixed, or the table gone) is struck off."""
    with psycopg.connect(database_url) as conn:
        tables = tables_with_column(conn, DISTRIBUTION_COLUMN)
        keys = unique_keys(conn, tables)
    for table in KEY_EXCEPTIONS:
        assert keys_without([k for k in keys if k.table == table], DISTRIBUTION_COLUMN, {}), (
            f"{table} now keeps the rule: remove it from KEY_EXCEPTIONS"
        )


def test_every_table_is_placed(database_url: str) -> None:
    """A table without job_id must say how it is distributed (docs/scale.md names them)."""
    with psycopg.connect(database_url) as conn:
        unplaced = all_tables(conn) - tables_with_column(conn, DISTRIBUTION_COLUMN) - set(NOT_BY_JOB)
    assert unplaced == set(), f"tables without {DISTRIBUTION_COLUMN}: place them in jobsight.collector.store.citus"


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ([Key("runs", "pk_runs", ("cluster", "job_id"))], []),
        ([Key("runs", "pk_runs", ("id",))], ["runs.pk_runs (id)"]),
        ([Key("runs", "uq_runs_name", ("cluster", None))], ["runs.uq_runs_name (cluster, <expression>)"]),
        ([Key("legacy", "pk_legacy", ("id",))], []),  # excepted on purpose
    ],
)
def test_the_check_finds_a_key_without_job_id(keys: list[Key], expected: list[str]) -> None:
    assert keys_without(keys, DISTRIBUTION_COLUMN, {"legacy": "a table excepted, with its reason"}) == expected


def test_the_check_finds_a_violation_in_a_real_catalogue(database_url: str) -> None:
    """Tables made here, in a schema of their own that is rolled back, with keys that break the rule."""
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE SCHEMA keys_check")
        conn.execute("CREATE TABLE keys_check.runs (id bigint PRIMARY KEY, job_id text, name text)")
        conn.execute("CREATE UNIQUE INDEX runs_name ON keys_check.runs (name)")
        conn.execute("CREATE UNIQUE INDEX runs_job_name ON keys_check.runs (job_id, name)")
        conn.execute("CREATE UNIQUE INDEX runs_lower ON keys_check.runs (lower(name), job_id)")
        conn.execute("CREATE TABLE keys_check.ledger (source text PRIMARY KEY)")
        tables = tables_with_column(conn, DISTRIBUTION_COLUMN, "keys_check")
        keys = unique_keys(conn, tables, "keys_check")
        placed = all_tables(conn, "keys_check")
        conn.rollback()
    assert tables == {"runs"} and placed == {"runs", "ledger"}
    assert keys_without(keys, DISTRIBUTION_COLUMN, KEY_EXCEPTIONS) == [
        "runs.runs_name (name)",
        "runs.runs_pkey (id)",
    ]
