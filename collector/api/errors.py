"""Errors raised where they happen and turned into HTTP answers in one place.

:func:`error_answer` says what each error is answered with; the FastAPI handlers
(:func:`install_error_handlers`) and the ingest fast path
(:mod:`jobsight.collector.api.routes.ingest`) both answer with it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from jobsight.collector.ingest.body import BadBody, BodyTooLarge
from jobsight.collector.ingest.write_rights import AuthError
from jobsight.collector.query.traces import TraceUnreadable
from jobsight.collector.store.db import DatabaseUnavailable, ReadTooLong, ValueRefused
from jobsight.protocol.wire import WireError

log = logging.getLogger("jobsight.collector")

RETRY_AFTER_S = 5
INGEST_PATH = "/v1/ingest"


class NotFound(LookupError):
    """The job or object asked for does not exist: 404."""


class ReadsBusy(RuntimeError):
    """This process is at work on as many heavy reads as it takes at once, and no turn came in time:
    503, retry later."""


@dataclass(frozen=True)
class ErrorAnswer:
    """What an error is answered with. ``content`` ``None``: an empty body. ``reject``: the
    reason counted in ``jobsight_ingest_rejects`` when the request was an ingest."""

    status: int
    content: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    reject: str | None = None


def _request_id() -> str:
    """A short id that ties an answer to its log line."""
    return uuid.uuid4().hex[:12]


def _body_error(status: int, message: str, reject: str) -> ErrorAnswer:
    return ErrorAnswer(status, {"detail": {"error": message, "record": None, "field": None}}, reject=reject)


def error_answer(exc: Exception, method: str, path: str) -> ErrorAnswer:
    """The answer to ``exc`` raised while serving ``method path``; logs what needs a look."""
    if isinstance(exc, WireError):
        return ErrorAnswer(422, {"detail": exc.as_dict()}, reject="invalid_record")
    if isinstance(exc, BadBody):
        return _body_error(400, str(exc), "bad_body")
    if isinstance(exc, BodyTooLarge):
        return _body_error(413, str(exc), "too_large")
    if isinstance(exc, AuthError):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        reject = "unauthorized" if exc.status == 401 else "forbidden"
        return ErrorAnswer(exc.status, {"detail": {"error": exc.reason}}, headers, reject)
    if isinstance(exc, NotFound):
        return ErrorAnswer(404, {"detail": {"error": str(exc)}})
    if isinstance(exc, DatabaseUnavailable):
        log.debug("%s %s: database unavailable: %s", method, path, exc)  # the outage itself is said once (store/db.py)
        return ErrorAnswer(503, {"detail": {"error": "database unavailable, retry later"}},
                           {"Retry-After": str(RETRY_AFTER_S)}, "database_unavailable")
    if isinstance(exc, ReadsBusy):
        error = f"{exc}; retry later"
        return ErrorAnswer(503, {"detail": {"error": error}}, {"Retry-After": str(RETRY_AFTER_S)}, "reads_busy")
    if isinstance(exc, ReadTooLong):
        # The read pool's statement_timeout: the read asked for more than a read may cost, or the database
        # is loaded; named, and answered like an outage (503, retry later) rather than as a server bug.
        log.info("%s %s: cancelled by the read statement timeout: %s", method, path, exc)
        error = "the read ran past the collector's read statement timeout and was cancelled; retry later"
        return ErrorAnswer(503, {"detail": {"error": error}}, {"Retry-After": str(RETRY_AFTER_S)}, "read_timeout")
    if isinstance(exc, ValueRefused):
        # A body (or parameter) validation could not judge up front: the client's fault, but
        # worth a look, since validation should have refused it with the record and field.
        request_id = _request_id()
        log.warning("request %s (%s %s): the database refused a value: %s", request_id, method, path, exc)
        error = f"a value is out of range for the database: {exc}"
        content = {"detail": {"error": error, "record": None, "field": None, "request_id": request_id}}
        return ErrorAnswer(422, content, reject="value_refused")
    if isinstance(exc, TraceUnreadable):
        return ErrorAnswer(422, {"detail": {"error": str(exc)}})
    if isinstance(exc, ClientDisconnect):
        # A shipper that gave up waiting (its timeout) before its body was read: nothing was
        # stored and it will send the batch again. Under overload this happens by the thousand,
        # and a traceback each (the default) cost the CPU the collector was short of.
        log.debug("%s %s: the client went away before its body was read", method, path)
        return ErrorAnswer(400, reject="client_gone")
    request_id = _request_id()
    log.error("request %s failed", request_id, exc_info=exc)
    return ErrorAnswer(500, {"detail": {"error": "internal error", "request_id": request_id}})


def count_reject(metrics: Any, path: str, answer: ErrorAnswer) -> None:
    """Count an ingest request's rejection by its reason."""
    if metrics is not None and answer.reject is not None and path == INGEST_PATH:
        metrics.rejects.labels(answer.reject).inc()


def install_error_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> Response:
        answer = error_answer(exc, request.method, request.url.path)
        count_reject(getattr(request.app.state, "metrics", None), request.url.path, answer)
        if answer.content is None:
            return Response(status_code=answer.status, headers=answer.headers or None)
        return JSONResponse(status_code=answer.status, content=answer.content, headers=answer.headers or None)

    for error in (WireError, BadBody, BodyTooLarge, AuthError, NotFound, ReadsBusy, DatabaseUnavailable, ReadTooLong,
                  ValueRefused, TraceUnreadable, ClientDisconnect, Exception):
        app.add_exception_handler(error, handle)
