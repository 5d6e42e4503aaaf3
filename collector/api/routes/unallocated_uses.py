"""GPUs used outside any job (admins): collector/query/unallocated_uses.py."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query

from jobsight.collector.api.deps import CurrentPrincipal, ReadPool
from jobsight.collector.api.job_access import Cluster
from jobsight.collector.ingest.write_rights import AuthError
from jobsight.collector.query.unallocated_uses import MAX_ROWS, unallocated_uses
from jobsight.collector.store.db import unit_of_work

router = APIRouter(tags=["unallocated-gpu-uses"])


@router.get("/v1/unallocated-gpu-uses")
def list_unallocated_gpu_uses(
    pool: ReadPool,
    principal: CurrentPrincipal,
    cluster: Cluster = None,
    node: Annotated[str | None, Query(max_length=256)] = None,
    hours: Annotated[float, Query(gt=0, le=24 * 366)] = 24.0,
    limit: Annotated[int, Query(ge=1, le=MAX_ROWS)] = 1000,
) -> dict[str, Any]:
    """Processes the node daemons found on GPUs that no job was given, in the last ``hours``,
    newest first: each with its node, GPU, pid, uid and GPU memory (admins only: it names every
    node's processes and users)."""
    if principal.kind != "admin":
        raise AuthError(403, "the GPUs used outside any job are for admins")
    until = dt.datetime.now(dt.UTC)
    with unit_of_work(pool) as conn:
        found = unallocated_uses(conn, until - dt.timedelta(hours=hours), until, cluster=cluster, node=node,
                                 limit=limit)
    return {"hours": hours, "uses": [use.as_json() for use in found]}
