"""``POST /v1/ingest``: one gzip JSON batch per request, stored by the group commit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.concurrency import run_in_threadpool
from psycopg_pool import ConnectionPool

from jobsight.collector import ingest, queries
from jobsight.collector.allocations import Allocation, AllocationCache
from jobsight.collector.auth import Authenticator, Principal, batch_jobs_to_check
from jobsight.collector.db import Connection, autocommit_connection, unit_of_work
from jobsight.collector.group_commit import GroupCommitter
from jobsight.collector.ingest_body import decode_body, read_body
from jobsight.collector.ingest_schema import INGEST_OPENAPI
from jobsight.collector.jobs_seen import JobsSeen
from jobsight.collector.partitions import PartitionKeeper
from jobsight.collector.settings import CollectorSettings
from jobsight.collector.telemetry import CollectorMetrics


@asynccontextmanager
async def group_commit(app: FastAPI) -> AsyncIterator[None]:
    """The writers of this process's groups, for as long as the app runs. Runs inside the app's
    lifespan (the pool is open) and stops first: the queued batches are written before the
    pool closes."""
    settings: CollectorSettings = app.state.settings
    committer = GroupCommitter(
        app.state.pool,
        wait_s=settings.group_commit_wait_ms / 1000,
        max_batches=settings.group_commit_max_batches,
        max_records=settings.group_commit_max_records,
        jobs=JobsSeen(),
        flush_every_s=settings.last_seen_flush_s,
        writers=settings.group_commit_writers,
    )
    committer.start()
    app.state.group_commit = committer
    app.state.allocations = AllocationCache()
    try:
        yield
    finally:
        await run_in_threadpool(committer.stop)


router = APIRouter(lifespan=group_commit)


@dataclass(frozen=True, slots=True)
class IngestContext:
    """What the ingest route uses of the app, and who is calling."""

    settings: CollectorSettings
    pool: ConnectionPool[Connection]
    keeper: PartitionKeeper
    metrics: CollectorMetrics
    auth: Authenticator
    principal: Principal
    slots: CapacityLimiter
    committer: GroupCommitter
    allocations: AllocationCache


async def ingest_context(request: Request, authorization: Annotated[str | None, Header()] = None) -> IngestContext:
    """The same as the dependencies of :mod:`jobsight.collector.deps`, in one ``async``
    function. FastAPI runs a plain ``def`` dependency in the thread pool, a round trip
    between threads for each: seven of them were most of the CPU a small batch cost. Nothing
    here blocks (the token check is an HMAC)."""
    state = request.app.state
    authenticator: Authenticator = state.authenticator
    return IngestContext(
        settings=state.settings,
        pool=state.pool,
        keeper=state.partitions,
        metrics=state.metrics,
        auth=authenticator,
        principal=authenticator.authenticate(authorization),
        slots=state.decode_slots,
        committer=state.group_commit,
        allocations=state.allocations,
    )


Ingest = Annotated[IngestContext, Depends(ingest_context)]


def _job_allocations(ctx: IngestContext, cluster: str, job_ids: list[str]) -> dict[str, Allocation]:
    def read(cluster: str, missing: list[str]) -> dict[str, Allocation]:
        with unit_of_work(ctx.pool) as conn:
            return queries.job_allocations(conn, cluster, missing)

    return ctx.allocations.get(cluster, job_ids, read)


def _ensure_partitions(pool: Any, keeper: Any, prepared: ingest.PreparedBatch) -> None:
    # Partition DDL needs its own autocommit connection, outside the group's transaction.
    with autocommit_connection(pool) as conn:
        ingest.ensure_partitions(conn, keeper, prepared)


@router.post("/v1/ingest", tags=["ingest"], openapi_extra=INGEST_OPENAPI)
async def post_ingest(request: Request, ctx: Ingest) -> dict[str, Any]:
    """Store a batch. A replay of an already stored ``(source, seq)`` answers 200 with
    ``status: duplicate`` and stores nothing."""
    started = time.perf_counter()
    with ctx.committer.arriving() as arrival:
        body = await read_body(request, ctx.settings.max_body_bytes)
        # Inflating, parsing and validating up to max_decompressed_bytes is seconds of CPU for
        # the largest bodies: in a worker thread, so the event loop keeps answering, and at
        # most max_concurrent_decodes at once (``slots``), so a burst cannot inflate them all.
        batch, prepared = await anyio.to_thread.run_sync(
            decode_body, body, request.headers.get("content-encoding"), ctx.settings.max_decompressed_bytes,
            limiter=ctx.slots,
        )
        del body  # the raw body is not needed while the batch is stored
        to_check = batch_jobs_to_check(ctx.principal, batch)
        allocations = ctx.allocations.cached(batch.cluster, to_check) if to_check else None
        if to_check and allocations is None:
            allocations = await run_in_threadpool(_job_allocations, ctx, batch.cluster, to_check)
        ctx.auth.authorize_batch(ctx.principal, batch, allocations)
        # Almost every batch lands in days whose partitions exist already: ask the keeper
        # before taking a connection.
        if any(ctx.keeper.missing(table, days) for table, days in prepared.days.items()):
            await run_in_threadpool(_ensure_partitions, ctx.pool, ctx.keeper, prepared)
        future = ctx.committer.submit(arrival, batch, prepared)
    # Answered once the batch's group has committed (or with its own transaction's error).
    stored = await asyncio.wrap_future(future)
    if prepared.counts.get("job_started"):
        ctx.allocations.forget(batch.cluster, {r["job"] for r in batch.records if r["kind"] == "job_started"})
    metrics = ctx.metrics
    metrics.latency.observe(time.perf_counter() - started)
    if not stored:
        metrics.batches.labels("duplicate").inc()
        return {"status": "duplicate", "source": batch.source, "seq": batch.seq, "records": 0}
    metrics.batches.labels("stored").inc()
    for kind, count in prepared.counts.items():
        metrics.records.labels(kind).inc(count)
    return {"status": "stored", "source": batch.source, "seq": batch.seq, "records": len(batch.records)}
