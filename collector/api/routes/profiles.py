"""Profiles, their traces and diagnosis, and on-demand profile requests.

A request moves ``pending → running → done | failed``: the API creates it, an agent
reports ``running`` when its window starts, ingest marks it ``done`` when the
profile carrying its id is stored (same transaction), and ``failed`` comes with a
reason from the agent, from ``job_ended``, or from
:data:`~jobsight.collector.query.profiles.PENDING_TIMEOUT` passing with no agent
picking it up.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from jobsight.collector.api.deps import Auth, CurrentPrincipal, ReadPool, Settings
from jobsight.collector.api.errors import NotFound
from jobsight.collector.api.job_access import AuthorizedJob, ReadableJob, ResolvedCluster, check_token_owner
from jobsight.collector.api.params import INT4_MAX, CleanStr, ProfileRowId, RequestId
from jobsight.collector.query import profiles as profile_queries
from jobsight.collector.query import series as queries
from jobsight.collector.query.traces import inflated_chunks, inflated_size
from jobsight.collector.store.db import unit_of_work
from jobsight.protocol.diagnosis import ACROSS_RANKS, diagnose

router = APIRouter(tags=["profiles"])

DIRECTIVE_POLL_S = 3.0
_TRANSITIONS = {
    "pending": {"running", "failed", "done"},
    "running": {"failed", "done"},
    "done": set(),
    "failed": set(),
}


class ProfileRequestIn(BaseModel):
    steps: int = Field(5, ge=1, le=profile_queries.MAX_REQUEST_STEPS, description="steps to profile")
    ranks: list[Annotated[int, Field(ge=0, le=INT4_MAX)]] | None = Field(
        None, max_length=4096, description="None: every rank"
    )


class StateIn(BaseModel):
    state: Literal["running", "done", "failed"]
    reason: CleanStr | None = Field(None, max_length=2000)
    profile_id: CleanStr | None = Field(None, max_length=200)


def _check_ranks(ranks: list[int] | None, max_ranks: int) -> None:
    """422 naming the field for a rank no job may have (``max_ranks_per_job``)."""
    past = [rank for rank in ranks or () if rank >= max_ranks]
    if past:
        raise HTTPException(422, {"error": f"rank {past[0]} is past the collector's max_ranks_per_job: it must be "
                                           f"under {max_ranks}", "field": "ranks"})


@router.post("/v1/jobs/{job_id}/profile-requests", status_code=201)
def create_profile_request(
    body: ProfileRequestIn, job: ReadableJob, pool: ReadPool, principal: CurrentPrincipal, settings: Settings
) -> dict[str, Any]:
    """Ask the job to profile its next ``steps`` steps on ``ranks``; agents pick it up within seconds."""
    requested_by = f"job:{principal.job}" if principal.job else principal.kind
    _check_ranks(body.ranks, settings.max_ranks_per_job)
    try:
        with unit_of_work(pool) as conn:
            request_id = profile_queries.request_profile(
                conn, job.cluster, job.job_id, body.steps, body.ranks, requested_by, settings.max_open_profile_requests
            )
    except profile_queries.TooManyOpenRequests as exc:
        raise HTTPException(429, {"error": str(exc), "open": exc.count, "max": exc.most}) from exc
    return {"id": request_id, "job_id": job.job_id, "state": "pending", "steps": body.steps, "ranks": body.ranks}


@router.get("/v1/jobs/{job_id}/profile-requests")
def list_profile_requests(
    job: ReadableJob, pool: ReadPool, limit: Annotated[int, Query(ge=1, le=200)] = 20
) -> dict[str, Any]:
    with unit_of_work(pool) as conn:
        # Fail the requests no agent took before listing, so the list says why they never ran.
        profile_queries.fail_untaken_requests(conn, job.cluster, job.job_id)
        rows = profile_queries.profile_requests(conn, job.cluster, job.job_id, limit=limit)
    return {"job_id": job.job_id, "requests": rows}


@router.get("/v1/directives")
def get_directives(
    request: Request, pool: ReadPool, principal: CurrentPrincipal, auth: Auth, cluster: ResolvedCluster,
    job: Annotated[str, Query(max_length=256)], rank: Annotated[int | None, Query(ge=0, le=INT4_MAX)] = None,
) -> dict[str, Any]:
    """What an agent should do now: open profile requests addressed to ``rank`` (one indexed query)."""
    # The job is a query parameter here, not the path's, so ReadableJob does not apply;
    # nor does its 404: an agent polling for a job the collector has not heard of gets nothing to do.
    auth.authorize_read(principal, job, cluster)
    check_token_owner(request.app.state, pool, principal, cluster, job)
    with unit_of_work(pool) as conn:
        rows = profile_queries.open_profile_requests(conn, cluster, job, rank)
    return {"job": job, "rank": rank, "poll_s": DIRECTIVE_POLL_S, "profile_requests": rows}


@router.post("/v1/profile-requests/{request_id}/state")
def set_request_state(
    request: Request, request_id: RequestId, body: StateIn, pool: ReadPool, principal: CurrentPrincipal, auth: Auth
) -> dict[str, Any]:
    """An agent's report: ``running`` when its window starts, ``failed`` with a reason.
    Moving backwards is refused (409); repeating the current state is a no-op."""
    with unit_of_work(pool) as conn:
        row = profile_queries.lock_profile_request(conn, request_id)
        if row is None:
            raise NotFound(f"profile request {request_id} not found")
        auth.authorize_read(principal, row["job_id"], row["cluster"])
        check_token_owner(request.app.state, pool, principal, row["cluster"], row["job_id"], conn)
        current = row["state"]
        if body.state != current:
            if body.state not in _TRANSITIONS[current]:
                raise HTTPException(409, f"profile request {request_id} is {current}; it cannot become {body.state}")
            reason = body.reason if body.state == "failed" else None
            profile_queries.set_profile_request_state(conn, request_id, body.state, reason, body.profile_id)
    return {"id": request_id, "state": body.state}


@router.get("/v1/jobs/{job_id}/profiles")
def list_profiles(
    job: ReadableJob, pool: ReadPool, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> dict[str, Any]:
    """The job's profiles, newest first, with summary and diagnosis; ``trace_url`` when a trace was kept."""
    with unit_of_work(pool) as conn:
        rows = profile_queries.list_profiles(conn, job.cluster, job.job_id, limit=limit)
    for row in rows:
        row["trace_url"] = f"/v1/jobs/{job.job_id}/profiles/{row['id']}/trace" if row["trace_bytes"] else None
    return {"job_id": job.job_id, "profiles": rows}


@router.get("/v1/jobs/{job_id}/profiles/{profile_row_id}/trace")
def download_trace(
    profile_row_id: ProfileRowId, job: AuthorizedJob, pool: ReadPool,
    format: Annotated[Literal["gz", "json"], Query(description="gz: .pt.trace.json.gz as stored; json: plain")] = "gz",
) -> Response:
    """The Chrome/Kineto trace, as a file Perfetto, TensorBoard (profile plugin) and
    Holistic Trace Analysis open: ``<job>.rank<r>.<profile>.pt.trace.json[.gz]``."""
    # AuthorizedJob, not ReadableJob: the profile row is looked up by job and cluster, so an
    # unknown job already answers "no trace" (404) without loading the job row first.
    with unit_of_work(pool) as conn:
        trace = profile_queries.profile_trace_file(conn, job.cluster, job.job_id, profile_row_id)
    if trace is None:
        raise NotFound(f"profile {profile_row_id} of job {job.job_id} has no trace")
    stem = f"{job.job_id}.rank{trace.rank if trace.rank is not None else 0}.{trace.profile_id}.pt.trace.json"
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    if format == "json":
        # Measured first, in bounded chunks: a trace that is broken or inflates past the cap
        # is a 422 (TraceUnreadable) before any byte goes out; then streamed chunk by chunk.
        size = inflated_size(trace.trace_gz)
        return StreamingResponse(
            inflated_chunks(trace.trace_gz), media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="{stem}"', "Content-Length": str(size)},
        )
    disposition = f'attachment; filename="{stem}.gz"'
    return Response(trace.trace_gz, media_type="application/gzip", headers={"Content-Disposition": disposition})


@router.get("/v1/jobs/{job_id}/diagnosis")
def job_diagnosis(job: ReadableJob, pool: ReadPool) -> dict[str, Any]:
    """Hints over the whole job: its recent steps on every rank (input-bound, straggler), its GPU
    samples (idle GPU, memory), the latest profile of each rank compared across ranks (straggler or
    communication-bound) and the hints stored with those profiles."""
    with unit_of_work(pool) as conn:
        steps = queries.recent_train_steps(conn, job.cluster, job.job_id)
        samples = queries.recent_gpu_samples(conn, job.cluster, job.job_id)
        latest = profile_queries.latest_profiles(conn, job.cluster, job.job_id)
    by_rank = {
        row["rank"]: {"breakdown": row["breakdown"]}
        for row in latest if isinstance(row["rank"], int) and isinstance(row["breakdown"], dict)
    }
    hints = diagnose(steps=steps, gpu_samples=samples, rank_profiles=by_rank)
    # With several ranks compared, one rank's own verdict on those rules is not the job's.
    seen = {hint["rule"] for hint in hints} | (set(ACROSS_RANKS) if len(by_rank) > 1 else set())
    for row in latest:
        # Rows stored before ingest checked the diagnosis's shape may hold anything: only a
        # list of objects naming their rule is hints; anything else is skipped, not a 500.
        stored = row["diagnosis"] if isinstance(row["diagnosis"], list) else []
        for hint in stored:
            rule = hint.get("rule") if isinstance(hint, dict) else None
            if isinstance(rule, str) and rule not in seen:
                seen.add(rule)
                hints.append({**hint, "source": {"profile": row["id"], "rank": row["rank"]}})
    return {
        "job_id": job.job_id, "hints": hints, "steps_considered": len(steps), "gpu_samples_considered": len(samples),
        "profiles_considered": len(by_rank),
    }
