"""Heavy reads (a job's epochs) worked on in processes of their own, at a lower CPU priority than ingest.

A read's Python work in the process that answers ingest takes that process's interpreter lock: eight
epochs reads at once made one-sample node batches wait 15-30 ms instead of 2 (bench/read_pressure.py),
and the collector process was at its core's limit while the database was not. Here each heavy read
runs in one of ``heavy_reads`` worker processes (:mod:`jobsight.collector.query.read_worker`, started
on first use and kept), each with one read connection of its own (the read statement timeout set by the
server for the session) and ``nice`` raised by ``niceness``, so the kernel gives ingest's process the
CPU first. The collector process only hands the request over and sends back the answer's bytes.

A read's errors come back as the store's own (:class:`~jobsight.collector.store.db.ReadTooLong`,
:class:`~jobsight.collector.store.db.DatabaseUnavailable`, ...), which the API maps as for any read.
A worker that dies, stalls or says something unreadable fails only the read it held (503), and is
replaced by the next read that needs one.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
from typing import IO, Final

from jobsight.collector.store.db import DatabaseUnavailable, ReadTooLong, ValueRefused

WORKER_MODULE: Final = "jobsight.collector.query.read_worker"

_ERRORS: Final[dict[bytes, type[Exception]]] = {
    b"too_long": ReadTooLong, b"unavailable": DatabaseUnavailable, b"refused": ValueRefused,
}


class ReadFailed(RuntimeError):
    """A heavy read failed in its worker for a reason that is not the database's (a bug: answered 500)."""


class _Worker:
    """One worker process and its two pipes."""

    def __init__(self, config: bytes) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, close_fds=True)
        self._to: IO[bytes] = self.process.stdin  # type: ignore[assignment]
        self._from: IO[bytes] = self.process.stdout  # type: ignore[assignment]
        self._to.write(config)
        self._to.flush()

    def ask(self, request: bytes, within_s: float) -> bytes:
        """The answer's body; the store's error for a read that failed there; :class:`_Broken` when the
        worker did not answer as it should within ``within_s`` (it is then of no further use)."""
        try:
            self._to.write(request)
            self._to.flush()
            ready, _, _ = select.select([self._from], [], [], within_s)
            if not ready:
                raise _Broken("a read worker did not answer in time")
            kind, _, rest = self._from.readline().rstrip(b"\n").partition(b" ")
        except (OSError, ValueError) as exc:
            raise _Broken("a read worker stopped") from exc
        if kind == b"ok":
            body = self._from.read(int(rest))
            if len(body) != int(rest):
                raise _Broken("a read worker stopped while answering")
            return body
        if kind in _ERRORS:
            raise _ERRORS[kind](rest.decode("utf-8", "replace"))
        if kind == b"error":
            raise ReadFailed(rest.decode("utf-8", "replace"))
        raise _Broken("a read worker stopped while reading")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self._to, self._from):
            pipe.close()


class _Broken(Exception):
    pass


class ReadWorkers:
    """The collector process's heavy-read workers: at most ``workers`` processes, started on first use.
    Callers bound how many reads run at once to ``workers`` (the API's heavy-read turns)."""

    def __init__(self, database_url: str, workers: int, statement_timeout_s: float, niceness: int) -> None:
        self._config = json.dumps({"database_url": database_url, "statement_timeout_s": statement_timeout_s,
                                   "niceness": niceness}).encode() + b"\n"
        self._answer_within_s = statement_timeout_s + 30.0
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._closed = False

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise DatabaseUnavailable("the collector is shutting down")
            if self._idle:
                return self._idle.pop()
        worker = _Worker(self._config)
        with self._lock:
            self._all.add(worker)
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.stop()

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.stop()

    def epochs_json(self, cluster: str, job_id: str, *, running: bool, max_epochs: int) -> bytes:
        """The job's epochs as JSON bytes, read by a worker."""
        request = json.dumps({"cluster": cluster, "job_id": job_id, "running": running,
                              "max_epochs": max_epochs}).encode() + b"\n"
        worker = self._take()
        try:
            body = worker.ask(request, self._answer_within_s)
        except _Broken as exc:
            self._drop(worker)
            raise DatabaseUnavailable(str(exc)) from exc
        except BaseException:
            self._give_back(worker)  # it answered: the read failed, not the worker
            raise
        self._give_back(worker)
        return body

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all, self._idle = list(self._all), set(), []
        for worker in workers:
            worker.stop()
