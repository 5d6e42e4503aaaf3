"""Connections and the one unit-of-work helper (CONTRIBUTING rule 3).

Routes never catch database errors: :func:`unit_of_work` commits or rolls back and
turns the errors a caller can act on into the two below, which the app's exception
handlers map to HTTP: :class:`DatabaseUnavailable` to 503 with ``Retry-After``,
:class:`ValueRefused` to 422. The database unreachable is PostgreSQL's ``OperationalError`` or, on
Citus, a worker's connection failing under the coordinator (``InternalError``, SQLSTATE XX000: "failure
on connection marked as essential"); an outage is logged once when it begins and once when it ends
(:data:`OUTAGE`), not once per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from jobsight.collector.store.migrate import libpq_url

Connection = psycopg.Connection[Any]

log = logging.getLogger("jobsight.collector.db")

# How Citus says that a worker it needed is gone (SQLSTATE XX000, psycopg's InternalError): a worker
# down is an outage of the shards it holds, as a coordinator down is, not a bug of the request.
_CITUS_CONNECTION_FAILURES: Final = (
    "failure on connection marked as essential", "connection to the remote node", "could not establish any connections",
    "connection not open", "server closed the connection unexpectedly", "terminating connection",
    "could not connect to", "connection error:",
)


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached or is shutting down; the client should retry."""


class ReadTooLong(RuntimeError):
    """A read ran past the read connections' ``statement_timeout`` and PostgreSQL cancelled it: it asked
    for more than a read may cost, or the database was too busy to answer it in time (not an outage)."""


class ValueRefused(ValueError):
    """PostgreSQL refused a value of the request (a ``DataError``: out of range, NUL in
    text, a bad time): the request is at fault, and sending it again will not help."""


def _first_line(exc: BaseException, fallback: str) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else fallback


def is_connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the database (or a Citus worker it needs) cannot be reached: what a retry
    later may get past."""
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return True
    if isinstance(exc, psycopg.InternalError):
        text = str(exc).lower()
        return any(marker in text for marker in _CITUS_CONNECTION_FAILURES)
    return False


class Outage:
    """Says an outage once when it begins and once when it ends, whatever the number of requests and
    passes that meet it in between (each still answered 503 and retried)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._refused = 0

    def met(self, reason: str) -> None:
        with self._lock:
            self._refused += 1
            if self._since is not None:
                return
            self._since = time.monotonic()
        log.warning("database unavailable, answering 503 until it is back: %s", reason)

    def passed(self) -> None:
        if self._since is None:  # the usual case: no lock taken
            return
        with self._lock:
            since, refused, self._since, self._refused = self._since, self._refused, None, 0
        if since is not None:
            log.warning("database back after %.0f s (%d request(s) or pass(es) met the outage)",
                        time.monotonic() - since, refused)

    @property
    def ongoing(self) -> bool:
        return self._since is not None


OUTAGE: Final = Outage()
"""This process's view of the database: one line when it goes, one when it comes back."""


def unavailable(exc: BaseException, fallback: str = "database unreachable") -> DatabaseUnavailable:
    """The :class:`DatabaseUnavailable` for a connection failure, the outage noted."""
    reason = "no database connection available" if isinstance(exc, PoolTimeout) else _first_line(exc, fallback)
    OUTAGE.met(reason)
    unavailable_error = DatabaseUnavailable(reason)
    unavailable_error.__cause__ = exc
    return unavailable_error


INGEST_POOL: Final = "jobsight-ingest"
READ_POOL: Final = "jobsight-read"
"""The names of the collector's two pools (and their connections' ``application_name``): ingest's, for
the group commit, partition DDL and allocation look-ups, and the reads', for every other route, so no
read can take a connection ingest needs."""


def open_pool(database_url: str, size: int, statement_timeout_s: float | None = None,
              name: str = INGEST_POOL) -> ConnectionPool[Connection]:
    """A pool of at most ``size`` connections; ``statement_timeout_s``: PostgreSQL cancels a statement
    of these connections that runs longer (``None``: the server's setting, none by default)."""
    # Sessions in UTC whatever the server's own TimeZone: jobsight's clock is UTC everywhere, and psycopg
    # then loads a timestamptz with datetime.timezone.utc, which pandas turns into a time column ten
    # times faster than datetimes of a ZoneInfo("Etc/UTC"), a server's usual default (docs/scale.md).
    # After the address's own ``options``, if it has any: they are kept, and these two win.
    site_options = conninfo_to_dict(libpq_url(database_url)).get("options")
    options = [str(site_options)] if site_options else []
    options.append("-c TimeZone=UTC")
    if statement_timeout_s is not None:
        # Set by the server for the whole session, from the start: no read can unset it with a query.
        options.append(f"-c statement_timeout={max(1, round(statement_timeout_s * 1000))}")
    kwargs: dict[str, Any] = {"row_factory": dict_row, "connect_timeout": 5, "application_name": name,
                              "options": " ".join(options)}
    if name == READ_POOL:
        # Never prepared: psycopg prepares a statement run five times on a connection, and PostgreSQL then
        # plans it once for any parameters. For a chart's read, whose time window picks the partitions and
        # sizes the aggregate, that generic plan was a fifth slower than one made for the window at hand
        # (a 64-GPU heatmap's 47 ms became 57-60 ms on a pooled connection; docs/scale.md).
        kwargs["prepare_threshold"] = None
    pool: ConnectionPool[Connection] = ConnectionPool(
        libpq_url(database_url),
        name=name,
        min_size=1,
        max_size=size,
        open=False,
        timeout=5.0,
        kwargs=kwargs,
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
        OUTAGE.passed()
    except psycopg.errors.QueryCanceled as exc:
        # statement_timeout (the read pool's): the request asked for too much, not an outage.
        raise ReadTooLong(_first_line(exc, "statement timeout")) from exc
    except PoolTimeout as exc:
        if pool.name == READ_POOL:  # every read connection busy with reads: no outage, ingest has its own
            raise DatabaseUnavailable("every read connection is busy") from exc
        raise unavailable(exc) from exc
    except (psycopg.OperationalError, psycopg.InternalError) as exc:
        if not is_connection_failure(exc):
            raise
        raise unavailable(exc) from exc
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
        OUTAGE.passed()
    except (PoolTimeout, psycopg.OperationalError, psycopg.InternalError) as exc:
        if not is_connection_failure(exc):
            raise
        raise unavailable(exc) from exc
    except psycopg.DataError as exc:
        raise ValueRefused(_first_line(exc, "value refused")) from exc
