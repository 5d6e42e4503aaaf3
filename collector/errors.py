"""Errors raised where they happen and turned into HTTP answers in one place."""

from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from jobsight.collector.auth import AuthError
from jobsight.collector.db import DatabaseUnavailable, ValueRefused
from jobsight.collector.traces import TraceUnreadable
from jobsight.protocol.wire import WireError

log = logging.getLogger("jobsight.collector")

RETRY_AFTER_S = 5


class BadBody(ValueError):
    """The body cannot be read as a batch at all (broken gzip or JSON): 400."""


class BodyTooLarge(ValueError):
    """The body is over the size limit, before or after decompression: 413."""


class NotFound(LookupError):
    """The job or object asked for does not exist: 404."""


def _request_id() -> str:
    """A short id that ties an answer to its log line."""
    return uuid.uuid4().hex[:12]


def _reject(request: Request, reason: str) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None and request.url.path == "/v1/ingest":
        metrics.rejects.labels(reason).inc()


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(WireError)
    async def wire_error(request: Request, exc: WireError) -> JSONResponse:
        _reject(request, "invalid_record")
        return JSONResponse(status_code=422, content={"detail": exc.as_dict()})

    @app.exception_handler(BadBody)
    async def bad_body(request: Request, exc: BadBody) -> JSONResponse:
        _reject(request, "bad_body")
        return JSONResponse(status_code=400, content={"detail": {"error": str(exc), "record": None, "field": None}})

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        _reject(request, "too_large")
        return JSONResponse(status_code=413, content={"detail": {"error": str(exc), "record": None, "field": None}})

    @app.exception_handler(AuthError)
    async def auth_error(request: Request, exc: AuthError) -> JSONResponse:
        _reject(request, "unauthorized" if exc.status == 401 else "forbidden")
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(status_code=exc.status, content={"detail": {"error": exc.reason}}, headers=headers)

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": {"error": str(exc)}})

    @app.exception_handler(DatabaseUnavailable)
    async def database_away(request: Request, exc: DatabaseUnavailable) -> JSONResponse:
        _reject(request, "database_unavailable")
        log.warning("database unavailable: %s", exc)
        return JSONResponse(
            status_code=503,
            content={"detail": {"error": "database unavailable, retry later"}},
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    @app.exception_handler(ValueRefused)
    async def value_refused(request: Request, exc: ValueRefused) -> JSONResponse:
        # A body (or parameter) validation could not judge up front: the client's fault, but
        # worth a look, since validation should have refused it with the record and field.
        _reject(request, "value_refused")
        request_id = _request_id()
        log.warning("request %s (%s %s): the database refused a value: %s",
                    request_id, request.method, request.url.path, exc)
        error = f"a value is out of range for the database: {exc}"
        return JSONResponse(
            status_code=422,
            content={"detail": {"error": error, "record": None, "field": None, "request_id": request_id}},
        )

    @app.exception_handler(TraceUnreadable)
    async def trace_unreadable(request: Request, exc: TraceUnreadable) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": {"error": str(exc)}})

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        # A shipper that gave up waiting (its timeout) before its body was read: nothing was
        # stored and it will send the batch again. Under overload this happens by the thousand,
        # and a traceback each (the default) cost the CPU the collector was short of.
        _reject(request, "client_gone")
        log.debug("%s %s: the client went away before its body was read", request.method, request.url.path)
        return Response(status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = _request_id()
        log.exception("request %s failed", request_id)
        return JSONResponse(
            status_code=500, content={"detail": {"error": "internal error", "request_id": request_id}}
        )
