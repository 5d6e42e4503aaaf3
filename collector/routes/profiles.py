"""Profiles, their traces and diagnosis, and on-demand profile requests.

A request moves ``pending → running → done | failed``: the API creates it, an agent
reports ``running`` when its window starts, ingest marks it ``done`` when the
profile carrying its id is stored (same transaction), and ``failed`` comes with a
reason from the agent, from ``job_ended``, or from :data:`PENDING_TIMEOUT` passing
with no agent picking it up.
"""

from __future__ import annotations

import datetime as dt
import gzip
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, Field

from jobsight.collector import profile_queries, queries
from jobsight.collector.auth import Principal
from jobsight.collector.db import Connection, unit_of_work
from jobsight.collector.deps import Auth, CurrentPrincipal, Pool, Settings
from jobsight.collector.errors import NotFound
from jobsight.protocol.diagnosis import diagnose

router = APIRouter(tags=["profiles"])

PENDING_TIMEOUT = dt.timedelta(minutes=10)
"""A request no agent has taken by then fails: the job has no jobsight callback, or is stuck."""
DIRECTIVE_POLL_S = 3.0

Cluster = Annotated[str | None, Query(description="cluster name; the collector's own when omitted")]

_TRANSITIONS = {
    "pending": {"running", "failed", "done"},
    "running": {"failed", "done"},
    "done": set(),
    "failed": set(),
}


class ProfileRequestIn(BaseModel):
    steps: int = Field(5, ge=1, le=profile_queries.MAX_REQUEST_STEPS, description="steps to profile")
    ranks: list[Annotated[int, Field(ge=0)]] | None = Field(None, max_length=4096, description="None: every rank")


class StateIn(BaseModel):
    state: Literal["running", "done", "failed"]
    reason: str | None = Field(None, max_length=2000)
    profile_id: str | None = Field(None, max_length=200)


def _cluster(principal: Principal, settings: Any, cluster: str | None) -> str:
    return cluster or principal.cluster or settings.cluster


def _job_or_404(conn: Connection, cluster: str, job_id: str) -> None:
    if queries.get_job(conn, cluster, job_id) is None:
        raise NotFound(f"job {job_id} not found in cluster {cluster}")


def _expire_pending(conn: Connection, cluster: str, job_id: str) -> None:
    conn.execute(
        """UPDATE profile_requests SET state = 'failed', updated_at = now(),
               reason = 'no agent took the request within ' || %s || ' minutes (is the jobsight callback in use?)'
           WHERE cluster = %s AND job_id = %s AND state = 'pending' AND created_at < now() - %s""",
        (str(int(PENDING_TIMEOUT.total_seconds() // 60)), cluster, job_id, PENDING_TIMEOUT),
    )


@router.post("/v1/jobs/{job_id}/profile-requests", status_code=201)
def create_profile_request(
    job_id: str, body: ProfileRequestIn, pool: Pool, settings: Settings, principal: CurrentPrincipal, auth: Auth,
    cluster: Cluster = None,
) -> dict[str, Any]:
    """Ask the job to profile its next ``steps`` steps on ``ranks``; agents pick it up within seconds."""
    cluster = _cluster(principal, settings, cluster)
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        _job_or_404(conn, cluster, job_id)
        request_id = profile_queries.request_profile(
            conn, cluster, job_id, body.steps, body.ranks, principal.job and f"job:{principal.job}" or principal.kind
        )
    return {"id": request_id, "job_id": job_id, "state": "pending", "steps": body.steps, "ranks": body.ranks}


@router.get("/v1/jobs/{job_id}/profile-requests")
def list_profile_requests(
    job_id: str, pool: Pool, settings: Settings, principal: CurrentPrincipal, auth: Auth, cluster: Cluster = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> dict[str, Any]:
    cluster = _cluster(principal, settings, cluster)
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        _job_or_404(conn, cluster, job_id)
        _expire_pending(conn, cluster, job_id)
        rows = profile_queries.profile_requests(conn, cluster, job_id, limit=limit)
    return {"job_id": job_id, "requests": rows}


@router.get("/v1/directives")
def get_directives(
    pool: Pool, settings: Settings, principal: CurrentPrincipal, auth: Auth,
    job: Annotated[str, Query(max_length=256)], rank: Annotated[int | None, Query(ge=0)] = None,
    cluster: Cluster = None,
) -> dict[str, Any]:
    """What an agent should do now: open profile requests addressed to ``rank`` (one indexed query)."""
    cluster = _cluster(principal, settings, cluster)
    auth.authorize_read(principal, job, cluster)
    with unit_of_work(pool) as conn:
        rows = conn.execute(
            """SELECT id, steps, ranks, state FROM profile_requests
               WHERE job_id = %s AND cluster = %s AND state IN ('pending', 'running')
                 AND (ranks IS NULL OR %s::int IS NULL OR %s::int = ANY(ranks))
                 AND created_at >= now() - %s
               ORDER BY id""",
            (job, cluster, rank, rank, PENDING_TIMEOUT),
        ).fetchall()
    return {"job": job, "rank": rank, "poll_s": DIRECTIVE_POLL_S, "profile_requests": rows}


@router.post("/v1/profile-requests/{request_id}/state")
def set_request_state(
    request_id: int, body: StateIn, pool: Pool, settings: Settings, principal: CurrentPrincipal, auth: Auth,
) -> dict[str, Any]:
    """An agent's report: ``running`` when its window starts, ``failed`` with a reason.
    Moving backwards is refused (409); repeating the current state is a no-op."""
    with unit_of_work(pool) as conn:
        row = conn.execute(
            "SELECT id, cluster, job_id, state FROM profile_requests WHERE id = %s FOR UPDATE", (request_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"profile request {request_id} not found")
        auth.authorize_read(principal, row["job_id"], row["cluster"])
        current = row["state"]
        if body.state != current:
            if body.state not in _TRANSITIONS[current]:
                raise HTTPException(409, f"profile request {request_id} is {current}; it cannot become {body.state}")
            conn.execute(
                """UPDATE profile_requests SET state = %s, reason = %s, profile_id = coalesce(%s, profile_id),
                       updated_at = now() WHERE id = %s""",
                (body.state, body.reason if body.state == "failed" else None, body.profile_id, request_id),
            )
    return {"id": request_id, "state": body.state}


@router.get("/v1/jobs/{job_id}/profiles")
def list_profiles(
    job_id: str, pool: Pool, settings: Settings, principal: CurrentPrincipal, auth: Auth, cluster: Cluster = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> dict[str, Any]:
    """The job's profiles, newest first, with summary and diagnosis; ``trace_url`` when a trace was kept."""
    cluster = _cluster(principal, settings, cluster)
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        _job_or_404(conn, cluster, job_id)
        rows = profile_queries.list_profiles(conn, cluster, job_id, limit=limit)
    for row in rows:
        row["trace_url"] = f"/v1/jobs/{job_id}/profiles/{row['id']}/trace" if row["trace_bytes"] else None
    return {"job_id": job_id, "profiles": rows}


@router.get("/v1/jobs/{job_id}/profiles/{profile_row_id}/trace")
def download_trace(
    job_id: str, profile_row_id: int, pool: Pool, settings: Settings, principal: CurrentPrincipal, auth: Auth,
    cluster: Cluster = None,
    format: Annotated[Literal["gz", "json"], Query(description="gz: .pt.trace.json.gz as stored; json: plain")] = "gz",
) -> Response:
    """The Chrome/Kineto trace, as a file Perfetto, TensorBoard (profile plugin) and
    Holistic Trace Analysis open: ``<job>.rank<r>.<profile>.pt.trace.json[.gz]``."""
    cluster = _cluster(principal, settings, cluster)
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        blob = profile_queries.profile_trace(conn, cluster, job_id, profile_row_id)
        meta = conn.execute("SELECT rank, profile_id FROM profiles WHERE id = %s", (profile_row_id,)).fetchone()
    if blob is None or meta is None:
        raise NotFound(f"profile {profile_row_id} of job {job_id} has no trace")
    stem = f"{job_id}.rank{meta['rank'] if meta['rank'] is not None else 0}.{meta['profile_id']}.pt.trace.json"
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    if format == "json":
        return Response(
            gzip.decompress(blob), media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="{stem}"'},
        )
    disposition = f'attachment; filename="{stem}.gz"'
    return Response(blob, media_type="application/gzip", headers={"Content-Disposition": disposition})


@router.get("/v1/jobs/{job_id}/diagnosis")
def job_diagnosis(
    job_id: str, pool: Pool, settings: Settings, principal: CurrentPrincipal, auth: Auth, cluster: Cluster = None,
) -> dict[str, Any]:
    """Hints over the whole job: its recent steps on every rank (input-bound, straggler), its GPU
    samples (idle GPU, memory) and the hints stored with its latest profile of each rank."""
    cluster = _cluster(principal, settings, cluster)
    auth.authorize_read(principal, job_id, cluster)
    with unit_of_work(pool) as conn:
        _job_or_404(conn, cluster, job_id)
        steps = conn.execute(
            """SELECT rank, duration_s, data_wait_s FROM steps
               WHERE job_id = %s AND cluster = %s AND coalesce(phase, 'train') = 'train'
               ORDER BY ts DESC LIMIT 5000""",
            (job_id, cluster),
        ).fetchall()
        samples = conn.execute(
            """SELECT util_gpu, mem_used, mem_total FROM gpu_samples
               WHERE job_id = %s AND cluster = %s ORDER BY ts DESC LIMIT 2000""",
            (job_id, cluster),
        ).fetchall()
        latest = conn.execute(
            """SELECT DISTINCT ON (rank) id, rank, profile_id, diagnosis FROM profiles
               WHERE job_id = %s AND cluster = %s ORDER BY rank, ts DESC""",
            (job_id, cluster),
        ).fetchall()
    hints = diagnose(steps=steps, gpu_samples=samples)
    seen = {hint["rule"] for hint in hints}
    for row in latest:
        for hint in row["diagnosis"] or []:
            if isinstance(hint, dict) and hint.get("rule") not in seen:
                seen.add(hint.get("rule"))
                hints.append({**hint, "source": {"profile": row["id"], "rank": row["rank"]}})
    return {"job_id": job_id, "hints": hints, "steps_considered": len(steps), "gpu_samples_considered": len(samples)}
