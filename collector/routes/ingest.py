"""``POST /v1/ingest``: one gzip JSON batch per request."""

from __future__ import annotations

import time
import zlib
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from jobsight.collector import ingest, queries
from jobsight.collector.auth import batch_jobs_to_check
from jobsight.collector.db import autocommit_connection, unit_of_work
from jobsight.collector.deps import Auth, CurrentPrincipal, Keeper, Metrics, Pool, Settings
from jobsight.collector.errors import BadBody, BodyTooLarge
from jobsight.protocol.wire import Batch, WireError, decode_batch, loads_batch

router = APIRouter()


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing to buffer more than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {declared} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """orjson for speed; on a body it refuses, the standard library, which parses NaN and
    Infinity so that validation can name the record and field that hold them."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return loads_batch(raw)


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Gunzip with a ceiling, so a small bomb cannot expand into memory."""
    if (encoding or "").lower() != "gzip" and body[:2] != b"\x1f\x8b":
        if len(body) > limit:
            raise BodyTooLarge(f"body is over the decompressed limit of {limit} bytes")
        return body
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadBody(f"body is not valid gzip: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyTooLarge(f"body decompresses to more than {limit} bytes")
    if not inflater.eof:
        raise BadBody("body is truncated gzip")
    return out


def _job_nodes(pool: Any, cluster: str, job_ids: list[str]) -> dict[str, list[str] | None]:
    with unit_of_work(pool) as conn:
        return queries.job_nodes(conn, cluster, job_ids)


def _store(pool: Any, keeper: Any, batch: Batch, prepared: ingest.PreparedBatch) -> bool:
    # Partition DDL needs its own autocommit connection; almost every batch lands in days
    # whose partitions exist already, so ask the keeper before taking one.
    if any(keeper.missing(table, days) for table, days in prepared.days.items()):
        with autocommit_connection(pool) as conn:
            ingest.ensure_partitions(conn, keeper, prepared)
    with unit_of_work(pool) as conn:
        return ingest.store(conn, batch, prepared)


@router.post("/v1/ingest", tags=["ingest"])
async def post_ingest(
    request: Request,
    settings: Settings,
    pool: Pool,
    keeper: Keeper,
    metrics: Metrics,
    principal: CurrentPrincipal,
    auth: Auth,
) -> dict[str, Any]:
    """Store a batch. A replay of an already stored ``(source, seq)`` answers 200 with
    ``status: duplicate`` and stores nothing."""
    started = time.perf_counter()
    body = await read_body(request, settings.max_body_bytes)
    raw = decompress(body, request.headers.get("content-encoding"), settings.max_decompressed_bytes)
    try:
        batch = decode_batch(raw, loads=parse_json)
        prepared = ingest.prepare(batch)
    except WireError as exc:
        if exc.record is None and exc.field is None:
            raise BadBody(exc.message) from exc
        raise
    to_check = batch_jobs_to_check(principal, batch)
    job_nodes = await run_in_threadpool(_job_nodes, pool, batch.cluster, to_check) if to_check else None
    auth.authorize_batch(principal, batch, job_nodes)
    stored = await run_in_threadpool(_store, pool, keeper, batch, prepared)
    metrics.latency.observe(time.perf_counter() - started)
    if not stored:
        metrics.batches.labels("duplicate").inc()
        return {"status": "duplicate", "source": batch.source, "seq": batch.seq, "records": 0}
    metrics.batches.labels("stored").inc()
    for kind, count in prepared.counts.items():
        metrics.records.labels(kind).inc(count)
    return {"status": "stored", "source": batch.source, "seq": batch.seq, "records": len(batch.records)}
