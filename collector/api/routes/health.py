"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from jobsight.collector.api.deps import IngestPool, Metrics
from jobsight.collector.store.db import DatabaseUnavailable, unit_of_work
from jobsight.collector.store.migrate import head_revision, schema_revision

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (says nothing about the database)."""
    # Async: answered on the event loop itself, never queued behind busy worker threads.
    return {"status": "ok"}


def _current_revision(pool: Any) -> str | None:
    with unit_of_work(pool) as conn:
        return schema_revision(conn)


@router.get("/readyz")
async def readyz(pool: IngestPool) -> JSONResponse:
    """Ready when the database answers and its schema is at this collector's head."""
    try:
        current = await run_in_threadpool(_current_revision, pool)
    except DatabaseUnavailable as exc:
        return JSONResponse(
            status_code=503, content={"status": "database unavailable", "error": str(exc)}, headers={"Retry-After": "5"}
        )
    head = head_revision()
    if current != head:
        return JSONResponse(
            status_code=503, content={"status": "schema out of date", "database": current, "expected": head}
        )
    return JSONResponse(content={"status": "ready", "schema": current})


@router.get("/metrics")
def prometheus_metrics(metrics: Metrics) -> Response:
    """The collector's counters; under ``--workers N`` the sum over every worker, whichever answers."""
    # Sync: in multiprocess mode this reads every worker's files, off the event loop.
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
