"""Every pass a collector process runs on a timer, each in a daemon thread until the app stops.

Housekeeping: partitions are made ahead and dropped past retention every hour; compaction's pass is started every
``JOBSIGHT_COMPACT_INTERVAL_S``. Every collector process runs both: partition DDL is idempotent, and
the compaction pass's advisory lock lets one process do the work at a time.
"""

from __future__ import annotations

import logging
import threading

from psycopg_pool import ConnectionPool

from jobsight.collector.config.settings import CollectorSettings
from jobsight.collector.passes import alerts, emissions
from jobsight.collector.passes.actions import ActionTimer, Notify
from jobsight.collector.passes.findings import Evaluator
from jobsight.collector.passes.notices import NoticeSender
from jobsight.collector.passes.reconcile import start_reconciler
from jobsight.collector.passes.reports import Reports, ReportTimer
from jobsight.collector.passes.summary_refresh import start_summary_refresh
from jobsight.collector.query.job_energy import carbon_of
from jobsight.collector.store.db import Connection, autocommit_connection
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction

log = logging.getLogger("jobsight.collector")

MAINTENANCE_INTERVAL_S = 3600.0


def maintain_partitions(pool: ConnectionPool[Connection], partitions: PartitionKeeper, settings: CollectorSettings,
                        stop: threading.Event) -> None:
    """Make partitions ahead and apply retention, hourly, until ``stop`` is set."""
    while not stop.wait(MAINTENANCE_INTERVAL_S):
        try:
            with autocommit_connection(pool) as conn:
                partitions.ensure_ahead(conn, settings.partitions_ahead_days)
                partitions.drop_older_than(conn, settings.retention_days)
        except Exception:  # boundary: maintenance must not kill the collector; next hour retries
            log.exception("partition maintenance failed")


def compact_on_timer(pool: ConnectionPool[Connection], partitions: PartitionKeeper, settings: CollectorSettings,
                     stop: threading.Event) -> None:
    """Pack the closed hours of GPU and host samples every ``JOBSIGHT_COMPACT_INTERVAL_S`` until ``stop`` is set."""
    tiers = settings.tiers
    while not stop.wait(tiers.compact_interval_s):
        try:
            with autocommit_connection(pool) as conn:
                compaction.run_pass(conn, partitions, older_than=tiers.older_than(),
                                    packed_retention_days=tiers.packed_retention(settings.retention_days))
        except Exception:  # boundary: a failed pass must not kill the collector; the next one retries
            log.exception("compaction pass failed")


def start_housekeeping(pool: ConnectionPool[Connection], partitions: PartitionKeeper, settings: CollectorSettings,
                       stop: threading.Event) -> None:
    """Both timers (compaction's only when its interval is not 0)."""
    threading.Thread(target=maintain_partitions, args=(pool, partitions, settings, stop), name="jobsight-maintenance",
                     daemon=True).start()
    if settings.tiers.compact_interval_s > 0:
        threading.Thread(target=compact_on_timer, args=(pool, partitions, settings, stop), name="jobsight-compaction",
                         daemon=True).start()


def start_passes(pool: ConnectionPool[Connection], partitions: PartitionKeeper, database_url: str,
                 settings: CollectorSettings, stop: threading.Event) -> None:
    """Every pass of this process, each in its daemon thread until ``stop`` is set: housekeeping,
    the health evaluator (one process of the collector's leads; see passes/findings.py) with the
    alert sender (every process; rows are claimed with SKIP LOCKED), reconciliation with Slurm
    (ends jobs whose epilog was never heard; passes/reconcile.py), the refresh of ended jobs' summaries
    that rows came after (passes/summary_refresh.py), the waste policies (passes/actions.py),
    the reports (passes/reports.py), the notice sender (passes/notices.py) and, where the site set a
    carbon intensity, the emissions of ended jobs (passes/emissions.py)."""
    start_housekeeping(pool, partitions, settings, stop)
    health, alert_settings = settings.health, settings.alerts
    if health.interval_s > 0:
        evaluator = Evaluator(
            database_url, health,
            lambda conn, finding, event, job: alerts.enqueue(conn, alert_settings, finding, event, job),
            alert_settings,
        )
        threading.Thread(target=evaluator.run, args=(stop,), name="jobsight-health", daemon=True).start()
    sender = alerts.AlertSender(pool, alert_settings, settings.dashboard_url)
    threading.Thread(target=sender.run, args=(stop,), name="jobsight-alerts", daemon=True).start()
    start_reconciler(database_url, settings.reconcile, stop)
    start_summary_refresh(database_url, settings.summary_refresh_interval_s, stop)
    notify = Notify(alert_settings, settings.dashboard_url) if settings.notices.warn_users else None
    if settings.actions.interval_s > 0 and settings.actions.policies:
        threading.Thread(target=ActionTimer(database_url, settings.actions, notify).run, args=(stop,),
                         name="jobsight-actions", daemon=True).start()
    start_notices(pool, database_url, settings, stop)
    carbon = carbon_of(settings.carbon)
    if carbon.configured():
        threading.Thread(target=emissions.run, args=(pool, carbon, stop), name="jobsight-emissions",
                         daemon=True).start()


def start_notices(pool: ConnectionPool[Connection], database_url: str, settings: CollectorSettings,
                  stop: threading.Event) -> None:
    """The reports' leader pass, when any report is on, and the notice sender of this process."""
    wanted = settings.notices
    if wanted.interval_s > 0 and (wanted.job_end_summary != "off" or wanted.report_period != "off"):
        reports = Reports(wanted, settings.alerts, settings.dashboard_url, carbon_of(settings.carbon))
        threading.Thread(target=ReportTimer(database_url, reports).run, args=(stop,), name="jobsight-reports",
                         daemon=True).start()
    sender = NoticeSender(pool, settings.alerts, wanted.poll_interval_s)
    threading.Thread(target=sender.run, args=(stop,), name="jobsight-notices", daemon=True).start()
