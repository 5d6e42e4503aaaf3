"""Connections and the one unit-of-work helper (STYLE rule 3).

Routes never catch database errors: :func:`unit_of_work` commits or rolls back and
turns the errors a caller can act on into the two below, which the app's exception
handlers map to HTTP: :class:`DatabaseUnavailable` to 503 with ``Retry-After``,
:class:`ValueRefused` to 422.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from jobsight.collector.store.migrate import libpq_url

Connection = psycopg.Connection[Any]


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached or is shutting down; the client should retry."""


class ValueRefused(ValueError):
    """PostgreSQL refused a value of the request (a ``DataError``: out of range, NUL in
    text, a bad time): the request is at fault, and sending it again will not help."""


def _first_line(exc: BaseException, fallback: str) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else fallback


def open_pool(database_url: str, size: int) -> ConnectionPool[Connection]:
    pool: ConnectionPool[Connection] = ConnectionPool(
        libpq_url(database_url),
        min_size=1,
        max_size=size,
        open=False,
        timeout=5.0,
        kwargs={"row_factory": dict_row, "connect_timeout": 5},
        # No check on every checkout (a round trip per request): a connection broken by a
        # database restart fails its request with 503, is discarded, and the retry gets a new one.
        reconnect_timeout=0,
    )
    pool.open(wait=False)
    return pool


@contextmanager
def unit_of_work(pool: ConnectionPool[Connection]) -> Iterator[Connection]:
    """A connection inside one transaction: committed on success, rolled back on error."""
    try:
        with pool.connection() as conn:
            with conn.transaction():
                yield conn
    except PoolTimeout as exc:
        raise DatabaseUnavailable("no database connection available") from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(_first_line(exc, "database unreachable")) from exc
    except psycopg.DataError as exc:
        # Validation is meant to refuse such values at the door; one that slips through is
        # still the request's fault, not the server's.
        raise ValueRefused(_first_line(exc, "value refused")) from exc


@contextmanager
def autocommit_connection(pool: ConnectionPool[Connection]) -> Iterator[Connection]:
    """A pooled connection in autocommit mode, for DDL that must not share a batch's transaction."""
    try:
        with pool.connection() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                conn.autocommit = False
    except PoolTimeout as exc:
        raise DatabaseUnavailable("no database connection available") from exc
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(_first_line(exc, "database unreachable")) from exc
    except psycopg.DataError as exc:
        raise ValueRefused(_first_line(exc, "value refused")) from exc
