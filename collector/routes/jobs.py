"""The read API over :mod:`jobsight.collector.queries`."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query

from jobsight.collector import queries
from jobsight.collector.db import unit_of_work
from jobsight.collector.deps import Auth, CurrentPrincipal, Pool, Settings
from jobsight.collector.errors import NotFound

router = APIRouter(prefix="/v1/jobs", tags=["read"])

Cluster = Annotated[str | None, Query(description="cluster name; the collector's own when omitted")]
Start = Annotated[dt.datetime | None, Query(description="ISO 8601; the job's first sample when omitted")]
End = Annotated[dt.datetime | None, Query(description="ISO 8601; the job's last sample when omitted")]
Points = Annotated[int, Query(ge=1, le=queries.MAX_POINTS, description="most buckets per series")]


@router.get("")
def list_jobs(
    pool: Pool,
    principal: CurrentPrincipal,
    auth: Auth,
    cluster: Cluster = None,
    user: str | None = None,
    state: str | None = None,
    partition: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    max_mean_util: Annotated[float | None, Query(ge=0, le=100)] = None,
    limit: Annotated[int, Query(ge=1, le=queries.MAX_PAGE)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    auth.authorize_read(principal)
    with unit_of_work(pool) as conn:
        rows, total = queries.list_jobs(
            conn,
            cluster=cluster,
            user=user,
            state=state,
            partition=partition,
            since=since,
            until=until,
            max_mean_util=max_mean_util,
            limit=limit,
            offset=offset,
        )
    following = offset + len(rows)
    return {"jobs": rows, "total": total, "next_offset": following if following < total else None}


def _job_or_404(conn: Any, cluster: str, job_id: str) -> dict[str, Any]:
    job = queries.get_job(conn, cluster, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found in cluster {cluster}")
    return job


@router.get("/{job_id}")
def get_job(
    job_id: str, pool: Pool, settings: Settings, principal: CurrentPrincipal, auth: Auth, cluster: Cluster = None
) -> dict[str, Any]:
    cluster = cluster or settings.cluster
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        return _job_or_404(conn, cluster, job_id)


@router.get("/{job_id}/gpu")
def get_gpu(
    job_id: str,
    pool: Pool,
    settings: Settings,
    principal: CurrentPrincipal,
    auth: Auth,
    cluster: Cluster = None,
    start: Start = None,
    end: End = None,
    points: Points = 500,
) -> dict[str, Any]:
    """GPU samples downsampled in SQL: at most ``points`` buckets per GPU."""
    cluster = cluster or settings.cluster
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        _job_or_404(conn, cluster, job_id)
        rows = queries.gpu_series(conn, cluster, job_id, start=start, end=end, points=points)
    return {"job_id": job_id, "points": points, "series": rows}


@router.get("/{job_id}/metrics")
def get_metrics(
    job_id: str,
    pool: Pool,
    settings: Settings,
    principal: CurrentPrincipal,
    auth: Auth,
    cluster: Cluster = None,
    name: str | None = None,
    rank: int | None = None,
    start: Start = None,
    end: End = None,
    points: Points = 500,
) -> dict[str, Any]:
    cluster = cluster or settings.cluster
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        _job_or_404(conn, cluster, job_id)
        rows = queries.metric_series(conn, cluster, job_id, name=name, rank=rank, start=start, end=end, points=points)
    return {"job_id": job_id, "series": rows}


@router.get("/{job_id}/steps")
def get_steps(
    job_id: str,
    pool: Pool,
    settings: Settings,
    principal: CurrentPrincipal,
    auth: Auth,
    cluster: Cluster = None,
    start: Start = None,
    end: End = None,
    points: Points = 500,
) -> dict[str, Any]:
    cluster = cluster or settings.cluster
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        _job_or_404(conn, cluster, job_id)
        rows = queries.step_series(conn, cluster, job_id, start=start, end=end, points=points)
    return {"job_id": job_id, "series": rows}


@router.get("/{job_id}/logs")
def get_logs(
    job_id: str,
    pool: Pool,
    settings: Settings,
    principal: CurrentPrincipal,
    auth: Auth,
    cluster: Cluster = None,
    rank: int | None = None,
    pid: int | None = None,
    tid: int | None = None,
    level: Annotated[str | None, Query(description="minimum level, e.g. WARNING")] = None,
    text: Annotated[str | None, Query(max_length=1000)] = None,
    start: Start = None,
    end: End = None,
    limit: Annotated[int, Query(ge=1, le=queries.MAX_PAGE)] = 200,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    cluster = cluster or settings.cluster
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        _job_or_404(conn, cluster, job_id)
        rows = queries.log_events(
            conn,
            cluster,
            job_id,
            rank=rank,
            pid=pid,
            tid=tid,
            level=level,
            text=text,
            start=start,
            end=end,
            limit=limit,
            offset=offset,
        )
    return {"job_id": job_id, "logs": rows}
