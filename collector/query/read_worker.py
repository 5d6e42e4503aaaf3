"""One heavy-read worker process (``python -m jobsight.collector.query.read_worker``), started by
:class:`~jobsight.collector.query.read_workers.ReadWorkers`.

Its own interpreter, started from nothing: no multiprocessing, which would run the parent's
``__main__`` again in the child (whatever a host process, a test runner, put there). It talks over its
standard input and output only, so nothing of it reaches a command line or an environment:

* the first line in is its configuration (JSON: the database URL, the read statement timeout, how
  much to raise its ``nice``);
* then each line in is one read (JSON: ``cluster``, ``job_id``, ``running``, ``max_epochs``), answered
  by ``ok <length>\\n`` and that many bytes of JSON, or by ``<kind> <message>\\n`` where the kind is
  ``too_long`` (the statement timeout), ``unavailable`` (the database), ``refused`` (a value) or
  ``error``.

It ends when its input ends or when the collector that started it is gone, however it went.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import IO, Any

import orjson

from jobsight.collector.query import epoch_energy
from jobsight.collector.store.db import (
    Connection,
    DatabaseUnavailable,
    ReadTooLong,
    ValueRefused,
    open_pool,
    unit_of_work,
)

HEAVY_READ_POOL = "jobsight-heavy-read"
"""The ``application_name`` of the workers' connections (one per worker)."""

log = logging.getLogger("jobsight.collector.read_worker")


def _exit_with(parent: int) -> None:
    """Ends this worker once the collector that started it is gone (a ``SIGKILL`` runs no shutdown): an
    orphan would hold its database connection for ever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _one_line(exc: BaseException) -> bytes:
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    return text.encode("utf-8", "replace")


def _answer(pool: Any, request: dict[str, Any]) -> tuple[bytes, bytes]:
    """The header and the body of one read's answer."""
    try:
        with unit_of_work(pool) as conn:
            answer = _epochs(conn, request)
    except ReadTooLong as exc:
        return b"too_long " + _one_line(exc), b""
    except DatabaseUnavailable as exc:
        return b"unavailable " + _one_line(exc), b""
    except ValueRefused as exc:
        return b"refused " + _one_line(exc), b""
    except Exception as exc:  # noqa: BLE001 - the collector answers 500 for it; the worker goes on
        log.exception("a heavy read failed")
        return b"error " + _one_line(exc), b""
    return b"ok %d" % len(answer), answer


def _epochs(conn: Connection, request: dict[str, Any]) -> bytes:
    answer = epoch_energy.job_epochs(conn, str(request["cluster"]), str(request["job_id"]),
                                     running=bool(request["running"]), max_epochs=int(request["max_epochs"]))
    # orjson, not FastAPI's encoder: a thousand epochs took the encoder longer than reading them.
    return orjson.dumps(answer)


def serve(reads: IO[bytes], answers: IO[bytes]) -> None:
    """Reads the configuration, then answers reads until ``reads`` ends."""
    config = json.loads(reads.readline())
    threading.Thread(target=_exit_with, args=(os.getppid(),), name="jobsight-read-worker-watch", daemon=True).start()
    if config["niceness"]:
        os.nice(int(config["niceness"]))
    pool = open_pool(str(config["database_url"]), 1, statement_timeout_s=float(config["statement_timeout_s"]),
                     name=HEAVY_READ_POOL)
    try:
        for line in reads:
            header, body = _answer(pool, json.loads(line))
            answers.write(header + b"\n" + body)
            answers.flush()
    finally:
        pool.close()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
