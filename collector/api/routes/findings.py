"""Health findings: a job's, and across the cluster (admins: every job; a job token: its own)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from jobsight.collector.api.deps import CurrentPrincipal, ReadPool
from jobsight.collector.api.job_access import Cluster, ReadableJob
from jobsight.collector.api.params import OffsetQuery
from jobsight.collector.ingest.write_rights import AuthError
from jobsight.collector.query import findings as finding_queries
from jobsight.collector.query.jobs import MAX_PAGE
from jobsight.collector.store.db import unit_of_work

router = APIRouter(tags=["health"])


@router.get("/v1/jobs/{job_id}/findings")
def get_job_findings(job: ReadableJob, pool: ReadPool) -> dict[str, Any]:
    """The job's findings: open ones first, most severe first; then resolved ones, newest first."""
    with unit_of_work(pool) as conn:
        rows = finding_queries.job_findings(conn, job.cluster, job.job_id)
    return {"job_id": job.job_id, "findings": rows}


@router.get("/v1/findings")
def list_findings(
    pool: ReadPool,
    principal: CurrentPrincipal,
    state: Annotated[Literal["open", "resolved", "all"], Query(description="open (default), resolved or all")] = "open",
    cluster: Cluster = None,
    user: Annotated[str | None, Query(max_length=256, description="only this user's jobs")] = None,
    rule: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 200,
    offset: OffsetQuery = 0,
) -> dict[str, Any]:
    """Findings across jobs. An admin token sees every job's; a job token only its own job's (a
    user's view of their jobs is the dashboard's, behind the site's login); a node token none."""
    job_id = None
    if principal.kind != "admin":
        if principal.kind != "job":
            raise AuthError(403, "a node token cannot read")
        job_id, cluster = principal.job, principal.cluster or cluster
    with unit_of_work(pool) as conn:
        rows, total = finding_queries.list_findings(
            conn, state=state, cluster=cluster, user=user, job_id=job_id, rule=rule, limit=limit, offset=offset)
    following = offset + len(rows)
    return {"findings": rows, "total": total, "next_offset": following if following < total else None}
