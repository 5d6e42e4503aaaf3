"""``POST /v1/ingest``: one gzip JSON batch per request."""

from __future__ import annotations

import time
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from jobsight.collector import ingest, queries
from jobsight.collector.auth import batch_jobs_to_check
from jobsight.collector.db import autocommit_connection, unit_of_work
from jobsight.collector.deps import Auth, CurrentPrincipal, DecodeSlots, Keeper, Metrics, Pool, Settings
from jobsight.collector.ingest_body import decode_body, read_body
from jobsight.collector.ingest_schema import INGEST_OPENAPI
from jobsight.protocol.wire import Batch

router = APIRouter()


def _job_allocations(pool: Any, cluster: str, job_ids: list[str]) -> dict[str, list[str] | None]:
    with unit_of_work(pool) as conn:
        return queries.job_allocations(conn, cluster, job_ids)


def _store(pool: Any, keeper: Any, batch: Batch, prepared: ingest.PreparedBatch) -> bool:
    # Partition DDL needs its own autocommit connection; almost every batch lands in days
    # whose partitions exist already, so ask the keeper before taking one.
    if any(keeper.missing(table, days) for table, days in prepared.days.items()):
        with autocommit_connection(pool) as conn:
            ingest.ensure_partitions(conn, keeper, prepared)
    with unit_of_work(pool) as conn:
        return ingest.store(conn, batch, prepared)


@router.post("/v1/ingest", tags=["ingest"], openapi_extra=INGEST_OPENAPI)
async def post_ingest(
    request: Request,
    settings: Settings,
    pool: Pool,
    keeper: Keeper,
    metrics: Metrics,
    principal: CurrentPrincipal,
    auth: Auth,
    slots: DecodeSlots,
) -> dict[str, Any]:
    """Store a batch. A replay of an already stored ``(source, seq)`` answers 200 with
    ``status: duplicate`` and stores nothing."""
    started = time.perf_counter()
    body = await read_body(request, settings.max_body_bytes)
    # Inflating, parsing and validating up to max_decompressed_bytes is seconds of CPU for
    # the largest bodies: in a worker thread, so the event loop keeps answering, and at
    # most max_concurrent_decodes at once (``slots``), so a burst cannot inflate them all.
    batch, prepared = await anyio.to_thread.run_sync(
        decode_body, body, request.headers.get("content-encoding"), settings.max_decompressed_bytes, limiter=slots
    )
    del body  # the raw body is not needed while the batch is stored
    to_check = batch_jobs_to_check(principal, batch)
    allocations = await run_in_threadpool(_job_allocations, pool, batch.cluster, to_check) if to_check else None
    auth.authorize_batch(principal, batch, allocations)
    stored = await run_in_threadpool(_store, pool, keeper, batch, prepared)
    metrics.latency.observe(time.perf_counter() - started)
    if not stored:
        metrics.batches.labels("duplicate").inc()
        return {"status": "duplicate", "source": batch.source, "seq": batch.seq, "records": 0}
    metrics.batches.labels("stored").inc()
    for kind, count in prepared.counts.items():
        metrics.records.labels(kind).inc(count)
    return {"status": "stored", "source": batch.source, "seq": batch.seq, "records": len(batch.records)}
