"""``POST /v1/ingest``: one gzip JSON batch per request, stored by the group commit.

Every node daemon sends one every batch age, so a large cluster sends hundreds a second,
and what FastAPI does around a handler (middleware, routing, dependencies, the response
class) cost about as much CPU as the batch's own work. So :func:`serve_ingest` takes a plain
``POST /v1/ingest`` straight from the ASGI server (:class:`~jobsight.collector.app.CollectorApp`
calls it), and the FastAPI route below, with the same steps (:func:`ingest_batch`) and the
same answers (:func:`~jobsight.collector.api.errors.error_answer`), is what OpenAPI documents and
what serves the rest (a query string, which the app-wide NUL check judges).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.concurrency import run_in_threadpool
from psycopg_pool import ConnectionPool
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from jobsight.collector.api.auth import Authenticator, Principal, Refusal, batch_jobs_to_check, sender_of
from jobsight.collector.api.errors import INGEST_PATH, count_reject, error_answer
from jobsight.collector.api.telemetry import CollectorMetrics
from jobsight.collector.config.settings import CollectorSettings
from jobsight.collector.ingest import self_reported
from jobsight.collector.ingest import write as ingest
from jobsight.collector.ingest.body import ClaimBounds, decode_body, read_body
from jobsight.collector.ingest.group_commit import GroupCommitter
from jobsight.collector.ingest.openapi_body import INGEST_OPENAPI
from jobsight.collector.ingest.rows import prepare_without
from jobsight.collector.jobs.allocations import Allocation, AllocationCache, job_allocations
from jobsight.collector.jobs.jobs_seen import JobsSeen
from jobsight.collector.store.db import Connection, autocommit_connection, unit_of_work
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.protocol.wire import Batch


@asynccontextmanager
async def group_commit(app: FastAPI) -> AsyncIterator[None]:
    """The writers of this process's groups and the threads batches are decoded in, for as
    long as the app runs. Runs inside the app's lifespan (the pool is open) and stops first:
    the queued batches are written before the pool closes."""
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
    # Inflating, parsing and validating up to max_decompressed_bytes is seconds of CPU for the
    # largest bodies: in these threads, so the event loop keeps answering, and at most
    # max_concurrent_decodes at once (one a thread), so a burst cannot inflate them all.
    decoders = ThreadPoolExecutor(settings.max_concurrent_decodes, thread_name_prefix="jobsight-decode")
    app.state.decoders = decoders
    try:
        yield
    finally:
        await run_in_threadpool(committer.stop)
        decoders.shutdown(wait=False, cancel_futures=True)


router = APIRouter(lifespan=group_commit)


@dataclass(frozen=True, slots=True)
class IngestContext:
    """What the ingest steps use of the app, and who is calling."""

    settings: CollectorSettings
    pool: ConnectionPool[Connection]
    keeper: PartitionKeeper
    metrics: CollectorMetrics
    auth: Authenticator
    principal: Principal
    decoders: ThreadPoolExecutor
    committer: GroupCommitter
    allocations: AllocationCache


def context_of(state: Any, authorization: str | None) -> IngestContext:
    """The context of a request to the app with ``state``; raises ``AuthError`` (401) for a
    missing or bad token. Nothing here blocks (the token check is an HMAC)."""
    authenticator: Authenticator = state.authenticator
    return IngestContext(
        settings=state.settings,
        pool=state.pool,
        keeper=state.partitions,
        metrics=state.metrics,
        auth=authenticator,
        principal=authenticator.authenticate(authorization),
        decoders=state.decoders,
        committer=state.group_commit,
        allocations=state.allocations,
    )


async def ingest_context(request: Request, authorization: Annotated[str | None, Header()] = None) -> IngestContext:
    """One ``async`` dependency: FastAPI runs a plain ``def`` one in the thread pool, a round
    trip between threads for each."""
    return context_of(request.app.state, authorization)


Ingest = Annotated[IngestContext, Depends(ingest_context)]


def _job_allocations(ctx: IngestContext, cluster: str, job_ids: list[str]) -> dict[str, Allocation]:
    def read(cluster: str, missing: list[str]) -> dict[str, Allocation]:
        with unit_of_work(ctx.pool) as conn:
            return job_allocations(conn, cluster, missing)

    return ctx.allocations.get(cluster, job_ids, read)


def _self_reported(principal: Principal, batch: Batch, allocations: Mapping[str, Allocation] | None) -> bool:
    """Whether a job token sends hardware samples of a job a prolog registered: its node daemon
    samples those, and the job's own word is kept only as self-reported metrics."""
    return (principal.kind == "job" and allocations is not None and allocations.get(principal.job or "") is not None
            and self_reported.has_samples(batch))


def _ensure_partitions(pool: Any, keeper: Any, prepared: ingest.PreparedBatch) -> None:
    # Partition DDL needs its own autocommit connection, outside the group's transaction.
    with autocommit_connection(pool) as conn:
        ingest.ensure_partitions(conn, keeper, prepared)


async def ingest_batch(
    ctx: IngestContext, chunks: AsyncIterator[bytes], declared_length: str | None, encoding: str | None
) -> dict[str, Any]:
    """Read, decode, authorise and store one batch; the answer's JSON. Raises what
    :func:`~jobsight.collector.api.errors.error_answer` turns into 4xx and 503 answers."""
    started = time.perf_counter()
    with ctx.committer.arriving() as arrival:
        body = await read_body(chunks, declared_length, ctx.settings.max_body_bytes)
        batch, prepared = await asyncio.get_running_loop().run_in_executor(
            ctx.decoders, decode_body, body, encoding, ctx.settings.max_decompressed_bytes, ClaimBounds.of(ctx.settings)
        )
        del body  # the raw body is not needed while the batch is stored
        to_check = batch_jobs_to_check(ctx.principal, batch)
        allocations = ctx.allocations.cached(batch.cluster, to_check) if to_check else None
        if to_check and allocations is None:
            allocations = await run_in_threadpool(_job_allocations, ctx, batch.cluster, to_check)
        refused = ctx.auth.authorize_batch(ctx.principal, batch, allocations)
        if refused:  # a node's records it may not write: dropped, the rest prepared again and stored
            batch, prepared = await asyncio.get_running_loop().run_in_executor(
                ctx.decoders, prepare_without, batch, {r.index for r in refused})
        if _self_reported(ctx.principal, batch, allocations):
            batch, prepared = self_reported.as_self_reported(batch)
        prepared.sender = sender_of(ctx.principal)
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
        return _answer_of("duplicate", batch, 0, refused)
    metrics.batches.labels("stored").inc()
    for kind, count in prepared.counts.items():
        metrics.records.labels(kind).inc(count)
    if refused:
        metrics.note_refused(prepared.sender, [(r.kind, r.code, r.reason) for r in refused])
    return _answer_of("stored", batch, len(batch.records), refused)


def _answer_of(status: str, batch: Batch, records: int, refused: list[Refusal]) -> dict[str, Any]:
    """The answer's JSON: with ``refused`` (each dropped record's index in the batch as sent, and
    why) only when a node token's batch had records it may not write."""
    answer: dict[str, Any] = {"status": status, "source": batch.source, "seq": batch.seq, "records": records}
    if refused:
        answer["refused"] = [r.as_json() for r in refused]
    return answer


@router.post(INGEST_PATH, tags=["ingest"], openapi_extra=INGEST_OPENAPI)
async def post_ingest(request: Request, ctx: Ingest) -> dict[str, Any]:
    """Store a batch. A replay of an already stored ``(source, seq)`` answers 200 with
    ``status: duplicate`` and stores nothing. A node token's batch with records the node may not
    write (another node's, a job registered elsewhere) stores the rest and answers 200 with
    ``refused``: each dropped record's ``index`` and ``reason``."""
    headers = request.headers
    return await ingest_batch(ctx, request.stream(), headers.get("content-length"), headers.get("content-encoding"))


# -- the plain ASGI path ----------------------------------------------------------------------

def takes(scope: Scope) -> bool:
    """Whether :func:`serve_ingest` serves this request: a ``POST /v1/ingest`` with no query."""
    return (scope["type"] == "http" and scope["path"] == INGEST_PATH and scope["method"] == "POST"
            and not scope.get("query_string"))


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body: bytes = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


async def _answer(send: Send, status: int, content: Any, headers: dict[str, str]) -> None:
    body = b"" if content is None else orjson.dumps(content)
    raw = [(b"content-length", str(len(body)).encode())]
    if content is not None:
        raw.append((b"content-type", b"application/json"))
    raw.extend((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items())
    start: Message = {"type": "http.response.start", "status": status, "headers": raw}
    await send(start)
    await send({"type": "http.response.body", "body": body})


async def serve_ingest(state: Any, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve a request :func:`takes` as the FastAPI route would, answering errors with
    :func:`~jobsight.collector.api.errors.error_answer` as the app's handlers do."""
    headers: dict[bytes, bytes] = dict(scope["headers"])
    try:
        authorization = headers.get(b"authorization")
        ctx = context_of(state, authorization.decode("latin-1") if authorization is not None else None)
        declared, encoding = headers.get(b"content-length"), headers.get(b"content-encoding")
        content = await ingest_batch(ctx, _chunks(receive), declared.decode("latin-1") if declared else None,
                                     encoding.decode("latin-1") if encoding else None)
    except Exception as exc:  # noqa: BLE001 - boundary: every error gets its answer, as in the app's handlers
        answer = error_answer(exc, "POST", INGEST_PATH)
        count_reject(getattr(state, "metrics", None), INGEST_PATH, answer)
        await _answer(send, answer.status, answer.content, answer.headers)
        return
    await _answer(send, 200, content, {})
