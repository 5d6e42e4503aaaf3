"""The suspect-GPU alert: a GPU that hurt ``suspect_alert_jobs`` jobs in the last
``suspect_window_days`` (collector/query/suspects.py) is sent to the site's alert sinks once per
ISO week, with what it did, the jobs and the drain line an admin may run. The health evaluator's
leader runs it every ``suspect_interval_s``; the notices outbox's key (per cluster and GPU, per ISO
week: :func:`jobsight.collector.passes.notices.notice_key`) makes a second run of the same week a
no-op, across restarts and leaders, and the same node name in two clusters two alerts.
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


def message(gpu: SuspectGpu, days: float, min_jobs: int) -> Message:
    """The alert of ``gpu``; its drain line only at ``min_jobs`` distinct jobs (the site's threshold)."""
    jobs = sorted(gpu.jobs)
    users = len(gpu.users)
    lines: list[tuple[str, ...]] = [
        (f"GPU {gpu.gpu} ({gpu.cluster}) hurt {len(jobs)} jobs of {users} user{'s' if users != 1 else ''} "
         f"in the last {days:g} days: {gpu.what()}.",),
        (f"Jobs: {', '.join(jobs[:20])}{' …' if len(jobs) > 20 else ''}",),
    ]
    drain = gpu.drain_suggestion(min_jobs)
    if drain:
        lines.append((f"To drain its node (jobsight does not): {drain}",))
    elif gpu.worth_watching(min_jobs):
        lines.append((f"Worth watching: a drain is suggested from {min_jobs} jobs on.",))
    else:
        lines.append(("Its node's name is not a plain host name, so no drain line is suggested.",))
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
            key=notices.notice_key("suspect", gpu.cluster, gpu.gpu, f"{year}-W{week:02d}"),
            legacy_key=f"suspect:{gpu.gpu}:{year}-W{week:02d}",
            message=message(gpu, health.suspect_window_days, health.suspect_alert_jobs))
    if written:
        log.info("%d suspect GPU alerts enqueued", written)
    return written
