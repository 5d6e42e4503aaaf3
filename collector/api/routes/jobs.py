"""The read API over :mod:`jobsight.collector.query.series` (log lines: :mod:`jobsight.collector.query.logs`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from jobsight.collector.api.deps import Auth, CurrentPrincipal, ReadPool
from jobsight.collector.api.job_access import Cluster, ReadableJob
from jobsight.collector.api.params import IsoTime, OffsetQuery, PidQuery, RankQuery, TidQuery
from jobsight.collector.query import jobs as job_queries
from jobsight.collector.query import logs as log_queries
from jobsight.collector.query import series as queries
from jobsight.collector.query.jobs import MAX_PAGE
from jobsight.collector.store.db import unit_of_work

router = APIRouter(prefix="/v1/jobs", tags=["read"])

Start = Annotated[IsoTime | None, Query(description="ISO 8601; the job's first sample when omitted")]
End = Annotated[IsoTime | None, Query(description="ISO 8601; the job's last sample when omitted")]
Points = Annotated[int, Query(ge=1, le=queries.MAX_POINTS, description="most buckets per series")]


@router.get("")
def list_jobs(
    pool: ReadPool,
    principal: CurrentPrincipal,
    auth: Auth,
    cluster: Cluster = None,
    job_id: Annotated[str | None, Query(description="one job id, in every cluster that holds it")] = None,
    user: str | None = None,
    state: str | None = None,
    partition: str | None = None,
    since: Annotated[IsoTime | None, Query(description="ISO 8601: jobs still running at or after it")] = None,
    until: Annotated[IsoTime | None, Query(description="ISO 8601: jobs started at or before it")] = None,
    max_mean_util: Annotated[float | None, Query(ge=0, le=100)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: OffsetQuery = 0,
) -> dict[str, Any]:
    # The list spans every cluster unless one is named, so ``cluster`` is not resolved here.
    auth.authorize_read(principal)
    with unit_of_work(pool) as conn:
        rows, total = job_queries.list_jobs(
            conn, cluster=cluster, job_id=job_id, user=user, state=state, partition=partition, since=since,
            until=until, max_mean_util=max_mean_util, limit=limit, offset=offset,
        )
    following = offset + len(rows)
    return {"jobs": rows, "total": total, "next_offset": following if following < total else None}


@router.get("/{job_id}")
def get_job(job: ReadableJob) -> dict[str, Any]:
    return job.row


@router.get("/{job_id}/gpu")
def get_gpu(
    job: ReadableJob, pool: ReadPool, start: Start = None, end: End = None, points: Points = 500
) -> dict[str, Any]:
    """GPU samples downsampled in SQL: at most ``points`` buckets per GPU."""
    with unit_of_work(pool) as conn:
        rows = queries.gpu_series(conn, job.cluster, job.job_id, start=start, end=end, points=points)
    return {"job_id": job.job_id, "points": points, "series": rows}


@router.get("/{job_id}/metrics")
def get_metrics(
    job: ReadableJob, pool: ReadPool, name: str | None = None, rank: RankQuery = None,
    start: Start = None, end: End = None, points: Points = 500,
) -> dict[str, Any]:
    with unit_of_work(pool) as conn:
        rows = queries.metric_series(
            conn, job.cluster, job.job_id, name=name, rank=rank, start=start, end=end, points=points
        )
    return {"job_id": job.job_id, "series": rows}


@router.get("/{job_id}/steps")
def get_steps(
    job: ReadableJob, pool: ReadPool, start: Start = None, end: End = None, points: Points = 500
) -> dict[str, Any]:
    with unit_of_work(pool) as conn:
        rows = queries.step_series(conn, job.cluster, job.job_id, start=start, end=end, points=points)
    return {"job_id": job.job_id, "series": rows}


@router.get("/{job_id}/logs")
def get_logs(
    job: ReadableJob,
    pool: ReadPool,
    rank: RankQuery = None,
    pid: PidQuery = None,
    tid: TidQuery = None,
    level: Annotated[str | None, Query(description="minimum level, e.g. WARNING")] = None,
    text: Annotated[str | None, Query(max_length=1000)] = None,
    start: Start = None,
    end: End = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 200,
    offset: OffsetQuery = 0,
) -> dict[str, Any]:
    """Log lines, newest first; a line sent without a rank has its process's (``rank_from_pid``)."""
    with unit_of_work(pool) as conn:
        rows = log_queries.log_events(
            conn, job.cluster, job.job_id, rank=rank, pid=pid, tid=tid, level=level, text=text,
            start=start, end=end, limit=limit, offset=offset,
        )
    return {"job_id": job.job_id, "logs": rows}
