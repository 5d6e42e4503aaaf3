"""GPUs that keep hurting jobs, across jobs (admins): collector/query/suspects.py."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query

from jobsight.collector.api.deps import CurrentPrincipal, ReadPool, Settings
from jobsight.collector.api.job_access import Cluster
from jobsight.collector.ingest.write_rights import AuthError
from jobsight.collector.query.suspects import suspect_gpus
from jobsight.collector.store.db import unit_of_work

router = APIRouter(tags=["suspects"])


@router.get("/v1/suspect-gpus")
def list_suspect_gpus(
    pool: ReadPool,
    principal: CurrentPrincipal,
    settings: Settings,
    cluster: Cluster = None,
    days: Annotated[float, Query(gt=0, le=366)] = 7.0,
    min_jobs: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> dict[str, Any]:
    """Each GPU with hardware Xids, error counters that rose, memory flags, or straggler and hung
    findings it caused in the last ``days``, with the jobs it touched and a suggested drain line;
    most jobs first (admins only: it names every user's jobs)."""
    if principal.kind != "admin":
        raise AuthError(403, "the suspect GPUs are for admins")
    until = dt.datetime.now(dt.UTC)
    with unit_of_work(pool) as conn:
        found = suspect_gpus(conn, until - dt.timedelta(days=days), until, cluster)
    # A drain line only for a GPU that hurt the site's count of jobs (health.suspect_alert_jobs).
    rows = [g.as_json(settings.health.suspect_alert_jobs) for g in found if len(g.jobs) >= min_jobs]
    return {"days": days, "gpus": rows}
