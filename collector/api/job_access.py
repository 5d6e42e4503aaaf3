"""The opening every per-job read route shares, as dependencies (CONTRIBUTING rule 1).

``ReadableJob``: resolve the cluster, authorise the read, load the job row, 404 when the
collector has never seen the job. ``AuthorizedJob`` stops before loading, for the two routes
whose answer does not need the job row (a stored summary, a stored trace).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from psycopg_pool import ConnectionPool

from jobsight.collector.api.deps import Auth, CurrentPrincipal, ReadPool, Settings
from jobsight.collector.api.errors import NotFound
from jobsight.collector.ingest.write_rights import Principal, check_job_owner
from jobsight.collector.jobs.allocations import Allocation, AllocationCache, job_allocations
from jobsight.collector.query.jobs import get_job
from jobsight.collector.store.db import Connection, unit_of_work

Cluster = Annotated[str | None, Query(description="cluster name; the collector's own when omitted")]
"""The ``cluster`` query parameter; ``None`` when the request did not name one."""


@dataclass(frozen=True)
class JobKey:
    """A job the principal may read; the collector need not know it (yet)."""

    cluster: str
    job_id: str


@dataclass(frozen=True)
class JobRef(JobKey):
    """A job the principal may read and the collector knows, with its row (and summary columns)
    as :func:`jobsight.collector.query.jobs.get_job` returns it."""

    row: dict[str, Any]


def job_not_found(job: JobKey) -> NotFound:
    """The one 404 of an unknown job, so every route words it the same."""
    return NotFound(f"job {job.job_id} not found in cluster {job.cluster}")


def resolve_cluster(principal: CurrentPrincipal, settings: Settings, cluster: Cluster = None) -> str:
    """The cluster a request means: the one it names, else the token's own (job and node tokens
    carry one; admin tokens do not), else this collector's."""
    return cluster or principal.cluster or settings.cluster


ResolvedCluster = Annotated[str, Depends(resolve_cluster)]


def check_token_owner(state: Any, pool: ConnectionPool[Any], principal: Principal, cluster: str, job: str,
                      conn: Connection | None = None) -> None:
    """For a job token: raise :class:`~jobsight.collector.ingest.write_rights.AuthError` (403) unless it was minted
    for the uid its job runs as (:func:`~jobsight.collector.ingest.write_rights.check_job_owner`); the registration
    comes through the process's allocation cache, so an agent's polls cost no query each; ``conn``:
    a caller's open transaction to read it in, rather than another pooled connection."""
    if principal.kind != "job":
        return
    cache: AllocationCache = state.allocations

    def read(cluster: str, jobs: list[str]) -> dict[str, Allocation]:
        if conn is not None:
            return job_allocations(conn, cluster, jobs)
        with unit_of_work(pool) as own:
            return job_allocations(own, cluster, jobs)

    check_job_owner(principal, cache.get(cluster, [job], read).get(job))


def authorized_job(
    request: Request, job_id: str, cluster: ResolvedCluster, principal: CurrentPrincipal, auth: Auth, pool: ReadPool
) -> JobKey:
    """``job_id`` (the path parameter) of the resolved cluster, once ``principal`` may read it
    (:class:`~jobsight.collector.ingest.write_rights.AuthError` otherwise)."""
    auth.authorize_read(principal, job_id, cluster)
    check_token_owner(request.app.state, pool, principal, cluster, job_id)
    return JobKey(cluster, job_id)


AuthorizedJob = Annotated[JobKey, Depends(authorized_job)]


def readable_job(job: AuthorizedJob, pool: ReadPool) -> JobRef:
    """The authorised job with its row; :class:`NotFound` when the collector has never seen it."""
    with unit_of_work(pool) as conn:
        row = get_job(conn, job.cluster, job.job_id)
    if row is None:
        raise job_not_found(job)
    return JobRef(job.cluster, job.job_id, row)


ReadableJob = Annotated[JobRef, Depends(readable_job)]
