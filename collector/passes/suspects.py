"""The suspect-GPU alert: a GPU that hurt ``suspect_alert_jobs`` jobs in the last
``suspect_window_days`` (collector/query/suspects.py) is sent to the site's alert sinks once per
ISO week, with what it did, the jobs and the drain line an admin may run. The health evaluator's
leader runs it every ``suspect_interval_s``; the notices outbox's key makes a second run of the
same week a no-op, across restarts and leaders.
"""

from __future__ import annotations

import datetime as dt
import logging

from jobsight.collector.config.alerts import AlertSettings
from jobsight.collector.config.health import HealthSettings
from jobsight.collector.passes import notices
from jobsight.collector.passes.alert_messages import Message, title_safe
from jobsight.collector.query.suspects import SuspectGpu, suspect_gpus
from jobsight.collector.store.db import Connection

log = logging.getLogger("jobsight.collector.passes.suspects")


def message(gpu: SuspectGpu, days: float) -> Message:
    jobs = sorted(gpu.jobs)
    lines: list[tuple[str, ...]] = [
        (f"GPU {gpu.gpu} ({gpu.cluster}) hurt {len(jobs)} jobs in the last {days:g} days: {gpu.what()}.",),
        (f"Jobs: {', '.join(jobs[:20])}{' …' if len(jobs) > 20 else ''}",),
    ]
    drain = gpu.drain_line()
    lines.append((f"To drain its node (jobsight does not): {drain}",) if drain else
                 ("Its node's name is not a plain host name, so no drain line is suggested.",))
    if gpu.self_reported:
        lines.append(("Some of this came from runs outside Slurm, which report their own GPUs.",))
    return Message(f"jobsight: suspect GPU {title_safe(gpu.gpu)}", tuple(lines), "warning")


def alert_suspects(conn: Connection, health: HealthSettings, alerts: AlertSettings, now: float) -> int:
    """Enqueue the alert of each GPU over the threshold; returns how many were new."""
    if health.suspect_alert_jobs <= 0 or not alerts.sinks:
        return 0
    until = dt.datetime.fromtimestamp(now, dt.UTC)
    since = until - dt.timedelta(days=health.suspect_window_days)
    year, week, _ = until.isocalendar()
    written = 0
    for gpu in suspect_gpus(conn, since, until):
        if len(gpu.jobs) < health.suspect_alert_jobs:
            continue
        written += notices.enqueue(
            conn, cluster=gpu.cluster, job_id="", kind="suspect", sinks=[s.name for s in alerts.sinks],
            key=f"suspect:{gpu.gpu}:{year}-W{week:02d}", message=message(gpu, health.suspect_window_days))
    if written:
        log.info("%d suspect GPU alerts enqueued", written)
    return written
