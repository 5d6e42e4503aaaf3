"""The collector's FastAPI application."""

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
from jobsight.collector.api.routes import epochs, findings, health, ingest, jobs, profiles, summaries
from jobsight.collector.api.telemetry import CollectorMetrics
from jobsight.collector.config.alerts import AlertSettings, load_alert_settings
from jobsight.collector.config.health import HealthSettings, load_health_settings
from jobsight.collector.config.settings import CollectorSettings, SettingsError, load_collector_settings
from jobsight.collector.config.tiers import TierSettings, load_tier_settings
from jobsight.collector.passes import alerts
from jobsight.collector.passes.findings import Evaluator
from jobsight.collector.passes.reconcile import start_reconciler
from jobsight.collector.store.db import autocommit_connection, open_pool
from jobsight.collector.store.migrate import schema_is_current
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction

log = logging.getLogger("jobsight.collector")

MAINTENANCE_INTERVAL_S = 3600.0


def _maintain(app: FastAPI, stop: threading.Event) -> None:
    """Make partitions ahead and apply retention, hourly, for as long as the app runs."""
    settings: CollectorSettings = app.state.settings
    while not stop.wait(MAINTENANCE_INTERVAL_S):
        try:
            with autocommit_connection(app.state.pool) as conn:
                app.state.partitions.ensure_ahead(conn, settings.partitions_ahead_days)
                app.state.partitions.drop_older_than(conn, settings.retention_days)
        except Exception:  # boundary: maintenance must not kill the collector; next hour retries
            log.exception("partition maintenance failed")


def _compact(app: FastAPI, stop: threading.Event) -> None:
    """Pack the closed days of GPU samples every ``JOBSIGHT_COMPACT_INTERVAL_S``. Every collector
    process runs this timer; the pass's advisory lock lets one of them do the work at a time."""
    settings: CollectorSettings = app.state.settings
    tiers: TierSettings = app.state.tier_settings
    while not stop.wait(tiers.compact_interval_s):
        try:
            with autocommit_connection(app.state.pool) as conn:
                compaction.run_pass(conn, app.state.partitions, older_than=tiers.older_than(),
                                    packed_retention_days=tiers.packed_retention(settings.retention_days))
        except Exception:  # boundary: a failed pass must not kill the collector; the next one retries
            log.exception("compaction pass failed")


def _start_health(app: FastAPI, database_url: str, stop: threading.Event) -> None:
    """The health evaluator (one process of the collector's leads; see collector/passes/findings.py) and
    the alert sender (every process; rows are claimed with SKIP LOCKED)."""
    health_settings: HealthSettings = app.state.health_settings
    alert_settings: AlertSettings = app.state.alert_settings
    if health_settings.interval_s > 0:
        evaluator = Evaluator(
            database_url, health_settings,
            lambda conn, finding, event, job: alerts.enqueue(conn, alert_settings, finding, event, job),
        )
        threading.Thread(target=evaluator.run, args=(stop,), name="jobsight-health", daemon=True).start()
    sender = alerts.AlertSender(app.state.pool, alert_settings, app.state.settings.dashboard_url)
    threading.Thread(target=sender.run, args=(stop,), name="jobsight-alerts", daemon=True).start()


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
        app.state.pool = open_pool(database_url, settings.pool_size)
        with autocommit_connection(app.state.pool) as conn:
            app.state.partitions.load(conn)
            app.state.partitions.ensure_ahead(conn, settings.partitions_ahead_days)
        stop = threading.Event()
        worker = threading.Thread(target=_maintain, args=(app, stop), name="jobsight-maintenance", daemon=True)
        worker.start()
        if app.state.tier_settings.compact_interval_s > 0:
            threading.Thread(target=_compact, args=(app, stop), name="jobsight-compaction", daemon=True).start()
        _start_health(app, database_url, stop)
        start_reconciler(database_url, stop)  # ends jobs whose epilog was never heard (collector/passes/reconcile.py)
        try:
            yield
        finally:
            stop.set()
            app.state.pool.close()

    # refuse_nul: a NUL in any query or path value is a 422 naming it, for every route at once.
    app = CollectorApp(
        title="jobsight collector", version="0.1.0", lifespan=lifespan, dependencies=[Depends(refuse_nul)]
    )
    app.state.settings = settings
    app.state.tier_settings = load_tier_settings()
    app.state.health_settings = load_health_settings()
    app.state.alert_settings = load_alert_settings()
    app.state.metrics = CollectorMetrics()
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
    return app
