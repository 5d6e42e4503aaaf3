"""What waste policies did: a job's steps (its owner, admins) and every job's (admins)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from jobsight.collector.api.deps import CurrentPrincipal, ReadPool
from jobsight.collector.api.job_access import Cluster, ReadableJob
from jobsight.collector.api.params import OffsetQuery
from jobsight.collector.ingest.write_rights import AuthError
from jobsight.collector.query import actions as action_queries
from jobsight.collector.query.jobs import MAX_PAGE
from jobsight.collector.store.db import unit_of_work

router = APIRouter(tags=["actions"])


@router.get("/v1/jobs/{job_id}/actions")
def get_job_actions(job: ReadableJob, pool: ReadPool) -> dict[str, Any]:
    """The steps policies took for the job (warnings, the action, an exemption), oldest first."""
    with unit_of_work(pool) as conn:
        rows = action_queries.job_actions(conn, job.cluster, job.job_id)
    return {"job_id": job.job_id, "actions": rows}


@router.get("/v1/actions")
def list_actions(
    pool: ReadPool,
    principal: CurrentPrincipal,
    cluster: Cluster = None,
    user: Annotated[str | None, Query(max_length=256)] = None,
    account: Annotated[str | None, Query(max_length=256)] = None,
    step: Annotated[Literal["warn", "warn_again", "act", "exempt"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 200,
    offset: OffsetQuery = 0,
) -> dict[str, Any]:
    """Every job's steps, newest first (admins only: a user sees their job's on its page)."""
    if principal.kind != "admin":
        raise AuthError(403, "the actions across jobs are for admins")
    with unit_of_work(pool) as conn:
        rows, total = action_queries.list_actions(conn, cluster=cluster, user=user, account=account, step=step,
                                                  limit=limit, offset=offset)
    following = offset + len(rows)
    return {"actions": rows, "total": total, "next_offset": following if following < total else None}
