"""The collector's FastAPI application: the entry that wires the rooms together.

Settings are loaded once (:func:`~jobsight.collector.config.settings.load_collector_settings`,
every section at once) and passed in; the passes start with the app (passes/timers.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from starlette.types import Receive, Scope, Send

from jobsight.collector.api.auth import Authenticator, ensure_admin_token, load_cluster_secret
from jobsight.collector.api.errors import install_error_handlers
from jobsight.collector.api.params import refuse_nul
from jobsight.collector.api.routes import (
    actions,
    epochs,
    findings,
    health,
    ingest,
    job_metrics,
    jobs,
    profiles,
    summaries,
    suspects,
    unallocated_uses,
)
from jobsight.collector.api.telemetry import CollectorMetrics
from jobsight.collector.config.settings import CollectorSettings, SettingsError, load_collector_settings
from jobsight.collector.passes.timers import start_passes
from jobsight.collector.query.read_workers import ReadWorkers
from jobsight.collector.store.db import INGEST_POOL, READ_POOL, autocommit_connection, open_pool
from jobsight.collector.store.migrate import schema_is_current
from jobsight.collector.store.partitions import PartitionKeeper

log = logging.getLogger("jobsight.collector")


class CollectorApp(FastAPI):
    """The collector's app: a plain ``POST /v1/ingest`` goes straight to
    :func:`~jobsight.collector.api.routes.ingest.serve_ingest`, past FastAPI's layers (see there
    why); everything else, FastAPI serves."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if ingest.takes(scope):
            await ingest.serve_ingest(self.state, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(settings: CollectorSettings | None = None) -> FastAPI:
    settings = settings or load_collector_settings()
    if not settings.database_url:
        raise SettingsError("JOBSIGHT_DATABASE_URL is not set (jobsight up sets it for the embedded database)")
    database_url = settings.database_url

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not schema_is_current(database_url):
            raise SettingsError("database schema is not current: run `jobsight migrate` first")
        # Two pools: ingest's (``pool``: the group commit, partition DDL, allocation look-ups) and the
        # reads' (``read_pool``, with a statement timeout), so that no read, however slow, holds a
        # connection ingest needs. The passes open their own.
        app.state.pool = open_pool(database_url, settings.pool_size, name=INGEST_POOL)
        app.state.read_pool = open_pool(database_url, settings.read_pool_size,
                                        statement_timeout_s=settings.read_statement_timeout_s, name=READ_POOL)
        app.state.read_workers = ReadWorkers(database_url, settings.heavy_reads, settings.read_statement_timeout_s,
                                             settings.heavy_read_niceness)
        with autocommit_connection(app.state.pool) as conn:
            app.state.partitions.load(conn)
            app.state.partitions.ensure_ahead(conn, settings.partitions_ahead_days)
        stop = threading.Event()
        start_passes(app.state.pool, app.state.partitions, database_url, settings, stop)
        try:
            yield
        finally:
            stop.set()
            app.state.read_workers.close()
            app.state.read_pool.close()
            app.state.pool.close()

    # refuse_nul: a NUL in any query or path value is a 422 naming it, for every route at once.
    app = CollectorApp(
        title="jobsight collector", version="0.1.0", lifespan=lifespan, dependencies=[Depends(refuse_nul)]
    )
    app.state.settings = settings
    app.state.metrics = CollectorMetrics()
    app.state.heavy_reads = threading.BoundedSemaphore(settings.heavy_reads)
    app.state.partitions = PartitionKeeper()
    # A group- or world-readable secret stops the start here (RuntimeError naming the file).
    secret = load_cluster_secret(settings.resolved_secret_file())
    app.state.authenticator = Authenticator([ensure_admin_token(settings.resolved_admin_token_file())], secret)
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(ingest.router)
    app.include_router(jobs.router)
    app.include_router(profiles.router)
    app.include_router(summaries.router)
    app.include_router(findings.router)
    app.include_router(epochs.router)
    app.include_router(actions.router)
    app.include_router(suspects.router)
    app.include_router(unallocated_uses.router)
    app.include_router(job_metrics.router)
    return app
