"""Distributing the schema on Citus (distributed PostgreSQL), by job id: ``jobsight migrate --citus``.

After the Alembic migrations have made the schema on the coordinator, :func:`distribute` places
every table, idempotently (a table already placed is left as it is):

* every table with a ``job_id`` column: distributed by ``job_id``, co-located with ``jobs``, so one
  job's rows of every table sit in one shard group and a job's page is read from one worker. A
  partitioned table is distributed as a whole; the daily partitions made later follow it;
* the batch ledger ``ingest_batches``: distributed by ``source`` (its key is ``(source, sender, seq)``);
* ``gpu_unallocated_uses`` (GPUs used outside any job, which have no job id): distributed by ``node``;
* :data:`REFERENCE_TABLES`, small lookup tables: a copy on every node;
* :data:`LOCAL_TABLES`: left on the coordinator, each for the reason given.

A table that fits none of these stops the command with its name: a new table must be placed on
purpose (``tests/citus/test_citus.py`` lists what is left local after the command).

Citus wants every unique key of a distributed table to contain its distribution column; the
schema keeps that true for ``job_id`` (``tests/collector/test_distribution_keys.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

DISTRIBUTION_COLUMN: Final = "job_id"
COLOCATE_WITH: Final = "jobs"
BY_SOURCE: Final[dict[str, str]] = {"ingest_batches": "source", "gpu_unallocated_uses": "node"}
"""Tables distributed by another column than ``job_id``, with it."""
REFERENCE_TABLES: Final[dict[str, str]] = {
    "gpu_devices": "the packed GPU tier's dictionary of devices: small, read with every packed block",
}
DISTRIBUTED_FUNCTIONS: Final[dict[str, str]] = {
    "jobsight_refuse_while_compacting()": "the trigger compaction puts on a day's raw shards while it packs them",
}
"""Functions the workers need, each with what for (made on every node by Citus)."""
LOCAL_TABLES: Final[dict[str, str]] = {
    "alembic_version": "Alembic's bookkeeping of the schema's revision, read by the migrations only",
}


class CitusError(RuntimeError):
    """The database is not a usable Citus coordinator, or a table cannot be placed; says which."""


@dataclass
class Placement:
    """What :func:`distribute` found and did, table by table."""

    distributed: dict[str, str] = field(default_factory=dict)
    """Table → its distribution column."""
    reference: list[str] = field(default_factory=list)
    local: list[str] = field(default_factory=list)
    placed_now: list[str] = field(default_factory=list)
    """The tables this call placed (empty when run again)."""


def _tables(conn: psycopg.Connection[Any]) -> dict[str, set[str]]:
    """The schema's tables (partitioned parents, not their partitions) → their columns."""
    rows = conn.execute(
        """SELECT c.relname, a.attname FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition"""
    ).fetchall()
    tables: dict[str, set[str]] = {}
    for table, column in rows:
        tables.setdefault(table, set()).add(column)
    return tables


def _placed(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, str | None]]:
    """Tables Citus already knows → (``distributed``/``reference``/…, distribution column)."""
    rows = conn.execute(
        "SELECT table_name::text, citus_table_type, distribution_column FROM citus_tables"
    ).fetchall()
    return {name: (kind, None if column in (None, "<none>") else column) for name, kind, column in rows}


def _ensure_extension(conn: psycopg.Connection[Any]) -> None:
    preload = conn.execute("SHOW shared_preload_libraries").fetchone()
    if preload is None or "citus" not in str(preload[0]).split(","):
        raise CitusError("this PostgreSQL does not load Citus: add citus to shared_preload_libraries "
                         "on every node and restart it")
    conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
    workers = conn.execute("SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND groupid <> 0"
                           ).fetchone()
    if workers is None or not workers[0]:
        raise CitusError("the coordinator has no workers: add them with citus_add_node(host, port) first")


def plan(tables: dict[str, set[str]]) -> list[tuple[str, str, str | None]]:
    """``(table, how, column)`` for every table, ``jobs`` first (the others co-locate with it);
    ``how`` is ``distributed``, ``reference`` or ``local``. :class:`CitusError` names a table
    that fits no rule."""
    steps: list[tuple[str, str, str | None]] = []
    unplaced = []
    for table in sorted(tables, key=lambda t: (t != COLOCATE_WITH, t)):
        if table in BY_SOURCE:
            steps.append((table, "distributed", BY_SOURCE[table]))
        elif table in REFERENCE_TABLES:
            steps.append((table, "reference", None))
        elif table in LOCAL_TABLES:
            steps.append((table, "local", None))
        elif DISTRIBUTION_COLUMN in tables[table]:
            steps.append((table, "distributed", DISTRIBUTION_COLUMN))
        else:
            unplaced.append(table)
    if unplaced:
        raise CitusError(f"tables without {DISTRIBUTION_COLUMN} and no placement: {', '.join(unplaced)} "
                         "(name them in jobsight.collector.store.citus)")
    return steps


def distribute(database_url: str) -> Placement:
    """Place every table of the migrated schema on the Citus coordinator at ``database_url``."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        _ensure_extension(conn)
        placed = _placed(conn)
        result = Placement()
        for function in DISTRIBUTED_FUNCTIONS:
            conn.execute("SELECT create_distributed_function(%s)", (function,))
        for table, how, column in plan(_tables(conn)):
            if how == "local":
                result.local.append(table)
                continue
            known = placed.get(table)
            if known is not None:
                _check_placement(table, how, column, known)
            elif how == "reference":
                conn.execute("SELECT create_reference_table(%s)", (table,))
                result.placed_now.append(table)
            else:
                colocate = COLOCATE_WITH if column == DISTRIBUTION_COLUMN and table != COLOCATE_WITH else "default"
                conn.execute("SELECT create_distributed_table(%s, %s, colocate_with => %s)",
                             (table, column, colocate))
                # Rows a single server held are now in the shards; the local copy is emptied.
                conn.execute("SELECT truncate_local_data_after_distributing_table(%s)",
                             (sql.Identifier(table).as_string(conn),))
                result.placed_now.append(table)
            if how == "reference":
                result.reference.append(table)
            else:
                assert column is not None
                result.distributed[table] = column
        return result


def _check_placement(table: str, how: str, column: str | None, known: tuple[str, str | None]) -> None:
    kind, known_column = known
    if how == "reference" and kind != "reference":
        raise CitusError(f"table {table} is {kind} in Citus, but jobsight keeps it a reference table")
    if how == "distributed" and (kind != "distributed" or known_column != column):
        raise CitusError(f"table {table} is {kind} by {known_column} in Citus, not distributed by {column}")
