"""FastAPI dependencies as typed aliases (CONTRIBUTING rule 1)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from psycopg_pool import ConnectionPool

from jobsight.collector.api.auth import Authenticator
from jobsight.collector.api.errors import ReadsBusy
from jobsight.collector.api.telemetry import CollectorMetrics
from jobsight.collector.config.settings import CollectorSettings
from jobsight.collector.ingest.write_rights import Principal
from jobsight.collector.query.read_workers import ReadWorkers
from jobsight.collector.store.db import Connection
from jobsight.collector.store.partitions import PartitionKeeper


def get_settings(request: Request) -> CollectorSettings:
    settings: CollectorSettings = request.app.state.settings
    return settings


def get_read_pool(request: Request) -> ConnectionPool[Connection]:
    """The reads' pool: every route but ingest (whose connections are its own) and readiness."""
    pool: ConnectionPool[Connection] = request.app.state.read_pool
    return pool


def get_ingest_pool(request: Request) -> ConnectionPool[Connection]:
    """Ingest's pool, for readiness: ready means ingest can reach the database."""
    pool: ConnectionPool[Connection] = request.app.state.pool
    return pool


HEAVY_READ_WAIT_S = 5.0


def heavy_read_turn(request: Request) -> Iterator[ReadWorkers]:
    """A turn among the heavy reads of this process (``heavy_reads`` at once), held for the request: the
    read workers, one of which is then free for it; :class:`~jobsight.collector.api.errors.ReadsBusy`
    (503) when no turn comes within :data:`HEAVY_READ_WAIT_S`."""
    turns: threading.BoundedSemaphore = request.app.state.heavy_reads
    if not turns.acquire(timeout=HEAVY_READ_WAIT_S):
        raise ReadsBusy(f"too many heavy reads at once ({request.app.state.settings.heavy_reads} per process)")
    try:
        workers: ReadWorkers = request.app.state.read_workers
        yield workers
    finally:
        turns.release()


def get_metrics(request: Request) -> CollectorMetrics:
    metrics: CollectorMetrics = request.app.state.metrics
    return metrics


def get_keeper(request: Request) -> PartitionKeeper:
    keeper: PartitionKeeper = request.app.state.partitions
    return keeper


def get_principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    authenticator: Authenticator = request.app.state.authenticator
    return authenticator.authenticate(authorization)


def get_authenticator(request: Request) -> Authenticator:
    authenticator: Authenticator = request.app.state.authenticator
    return authenticator


Settings = Annotated[CollectorSettings, Depends(get_settings)]
ReadPool = Annotated[ConnectionPool[Any], Depends(get_read_pool)]
IngestPool = Annotated[ConnectionPool[Any], Depends(get_ingest_pool)]
HeavyReadTurn = Annotated[ReadWorkers, Depends(heavy_read_turn)]
Metrics = Annotated[CollectorMetrics, Depends(get_metrics)]
Keeper = Annotated[PartitionKeeper, Depends(get_keeper)]
CurrentPrincipal = Annotated[Principal, Depends(get_principal)]
Auth = Annotated[Authenticator, Depends(get_authenticator)]
