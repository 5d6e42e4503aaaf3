"""``GET /v1/jobs/{job_id}/summary``: the job summary of :mod:`jobsight.collector.summaries`."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query

from jobsight.collector import summaries
from jobsight.collector.db import unit_of_work
from jobsight.collector.deps import Auth, CurrentPrincipal, Pool, Settings
from jobsight.collector.errors import NotFound

router = APIRouter(prefix="/v1/jobs", tags=["read"])


@router.get("/{job_id}/summary")
def get_summary(
    job_id: str,
    pool: Pool,
    settings: Settings,
    principal: CurrentPrincipal,
    auth: Auth,
    cluster: Annotated[str | None, Query(description="cluster name; the collector's own when omitted")] = None,
) -> dict[str, Any]:
    """The stored summary of an ended job (``final: true``), or one computed now from the
    rows so far for a job still running (``final: false``, not stored), with the link to
    the job's dashboard page."""
    cluster = cluster or settings.cluster
    auth.authorize_read(principal, job_id, cluster)
    link = f"{settings.dashboard_url.rstrip('/')}/job?{urlencode({'cluster': cluster, 'job': job_id})}"
    with unit_of_work(pool) as conn:
        row = summaries.get_summary(conn, cluster, job_id)
        if row is not None:
            return {"cluster": cluster, "job_id": job_id, "final": True, "computed_at": row["computed_at"],
                    "summary": row["summary"], "dashboard_url": link}
        live = summaries.compute_summary(conn, cluster, job_id)
    if live is None:
        raise NotFound(f"job {job_id} not found in cluster {cluster}")
    return {"cluster": cluster, "job_id": job_id, "final": False, "computed_at": None, "summary": live,
            "dashboard_url": link}
