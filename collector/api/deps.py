"""FastAPI dependencies as typed aliases (STYLE rule 1)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Request
from psycopg_pool import ConnectionPool

from jobsight.collector.api.auth import Authenticator, Principal
from jobsight.collector.api.telemetry import CollectorMetrics
from jobsight.collector.config.settings import CollectorSettings
from jobsight.collector.store.db import Connection
from jobsight.collector.store.partitions import PartitionKeeper


def get_settings(request: Request) -> CollectorSettings:
    settings: CollectorSettings = request.app.state.settings
    return settings


def get_pool(request: Request) -> ConnectionPool[Connection]:
    pool: ConnectionPool[Connection] = request.app.state.pool
    return pool


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
Pool = Annotated[ConnectionPool[Any], Depends(get_pool)]
Metrics = Annotated[CollectorMetrics, Depends(get_metrics)]
Keeper = Annotated[PartitionKeeper, Depends(get_keeper)]
CurrentPrincipal = Annotated[Principal, Depends(get_principal)]
Auth = Annotated[Authenticator, Depends(get_authenticator)]
