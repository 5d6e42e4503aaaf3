"""``POST /v1/ingest``: one gzip JSON batch per request, HTTP translated to the ingest room's entry
(:func:`~jobsight.collector.ingest.batch.ingest_batch`, which reads, authorises and stores it) and its
outcome back to an answer and the ingest metrics.

Every node daemon sends one every batch age, so a large cluster sends hundreds a second,
and what FastAPI does around a handler (middleware, routing, dependencies, the response
class) cost about as much CPU as the batch's own work. So :func:`serve_ingest` takes a plain
``POST /v1/ingest`` straight from the ASGI server (:class:`~jobsight.collector.app.CollectorApp`
calls it), and the FastAPI route below, with the same steps (:func:`answer_batch`) and the
same answers (:func:`~jobsight.collector.api.errors.error_answer`), is what OpenAPI documents and
what serves the rest (a query string, which the app-wide NUL check judges).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope, Send

from jobsight.collector.api.auth import Authenticator
from jobsight.collector.api.errors import INGEST_PATH, count_reject, error_answer
from jobsight.collector.api.telemetry import CollectorMetrics
from jobsight.collector.ingest.batch import Intake, ingest_batch, start_intake
from jobsight.collector.ingest.openapi_body import INGEST_OPENAPI
from jobsight.collector.ingest.write_rights import Principal, Refusal
from jobsight.protocol.wire import Batch


@asynccontextmanager
async def group_commit(app: FastAPI) -> AsyncIterator[None]:
    """The ingest path's running parts (:class:`~jobsight.collector.ingest.batch.Intake`: the group
    commit's writers and the decode threads) for as long as the app runs. Runs inside the app's
    lifespan (the pool is open) and stops first: the queued batches are written before the pool closes."""
    intake = start_intake(app.state.pool, app.state.partitions, app.state.settings)
    app.state.intake = intake
    app.state.group_commit = intake.committer
    app.state.allocations = intake.allocations  # the read checks' cache too (job_access)
    try:
        yield
    finally:
        await run_in_threadpool(intake.stop)


router = APIRouter(lifespan=group_commit)


@dataclass(frozen=True, slots=True)
class IngestContext:
    """What the route uses of the app, and who is calling."""

    intake: Intake
    metrics: CollectorMetrics
    principal: Principal


def context_of(state: Any, authorization: str | None) -> IngestContext:
    """The context of a request to the app with ``state``; raises ``AuthError`` (401) for a
    missing or bad token. Nothing here blocks (the token check is an HMAC)."""
    authenticator: Authenticator = state.authenticator
    return IngestContext(intake=state.intake, metrics=state.metrics,
                         principal=authenticator.authenticate(authorization))


async def ingest_context(request: Request, authorization: Annotated[str | None, Header()] = None) -> IngestContext:
    """One ``async`` dependency: FastAPI runs a plain ``def`` one in the thread pool, a round
    trip between threads for each."""
    return context_of(request.app.state, authorization)


Ingest = Annotated[IngestContext, Depends(ingest_context)]


async def answer_batch(
    ctx: IngestContext, chunks: AsyncIterator[bytes], declared_length: str | None, encoding: str | None
) -> dict[str, Any]:
    """Store one batch (:func:`~jobsight.collector.ingest.batch.ingest_batch`) and count it; the
    answer's JSON. Raises what :func:`~jobsight.collector.api.errors.error_answer` turns into 4xx
    and 503 answers."""
    started = time.perf_counter()
    outcome = await ingest_batch(ctx.intake, ctx.principal, chunks, declared_length, encoding)
    metrics, batch, refused = ctx.metrics, outcome.batch, outcome.refused
    metrics.latency.observe(time.perf_counter() - started)
    if not outcome.stored:
        metrics.batches.labels("duplicate").inc()
        return _answer_of("duplicate", batch, 0, refused)
    metrics.batches.labels("stored").inc()
    for kind, count in outcome.counts.items():
        metrics.records.labels(kind).inc(count)
    if refused:
        metrics.note_refused(outcome.sender, [(r.kind, r.code, r.reason) for r in refused])
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
    return await answer_batch(ctx, request.stream(), headers.get("content-length"), headers.get("content-encoding"))


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
        content = await answer_batch(ctx, _chunks(receive), declared.decode("latin-1") if declared else None,
                                     encoding.decode("latin-1") if encoding else None)
    except Exception as exc:  # noqa: BLE001 - boundary: every error gets its answer, as in the app's handlers
        answer = error_answer(exc, "POST", INGEST_PATH)
        count_reject(getattr(state, "metrics", None), INGEST_PATH, answer)
        await _answer(send, answer.status, answer.content, answer.headers)
        return
    await _answer(send, 200, content, {})
