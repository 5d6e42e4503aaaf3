"""Heavy reads (a job's epochs) worked on in processes of their own, at a lower CPU priority than ingest.

A read's Python work in the process that answers ingest takes that process's interpreter lock: eight
epochs reads at once made one-sample node batches wait 15-30 ms instead of 2 (bench/read_pressure.py),
and the collector process was at its core's limit while the database was not. Here each heavy read
runs in one of ``heavy_reads`` worker processes started on first use (``spawn``: nothing of the
collector's threads or connections is inherited), each with one read connection of its own (the read
statement timeout set by the server for the session) and ``nice`` raised by ``niceness``, so the
kernel gives ingest's process the CPU first. The collector process only hands the request over and
sends back the answer's bytes.

A read's errors come back as the store's own (:class:`~jobsight.collector.store.db.ReadTooLong`,
:class:`~jobsight.collector.store.db.DatabaseUnavailable`, ...), which the API maps as for any read.
A worker that dies (killed, out of memory) fails only the reads it held: they are answered 503, and the
next read starts new workers.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Final

import orjson
from psycopg_pool import ConnectionPool

from jobsight.collector.query import epoch_energy
from jobsight.collector.store.db import Connection, DatabaseUnavailable, open_pool, unit_of_work

HEAVY_READ_POOL: Final = "jobsight-heavy-read"
"""The ``application_name`` of the workers' connections (one per worker)."""

_pool: ConnectionPool[Connection] | None = None
"""In a worker: its one read connection."""


def _exit_with(parent: int) -> None:
    """Ends this worker once the collector process that started it is gone, however it went (a
    ``SIGKILL`` runs no shutdown): an orphan would hold its database connection for ever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _start_worker(database_url: str, statement_timeout_s: float, niceness: int) -> None:
    global _pool
    threading.Thread(target=_exit_with, args=(os.getppid(),), name="jobsight-read-worker-watch", daemon=True).start()
    if niceness:
        os.nice(niceness)
    _pool = open_pool(database_url, 1, statement_timeout_s=statement_timeout_s, name=HEAVY_READ_POOL)


def _epochs_json(cluster: str, job_id: str, running: bool, max_epochs: int) -> bytes:
    """In a worker: the job's epochs (:func:`~jobsight.collector.query.epoch_energy.job_epochs`) as JSON."""
    assert _pool is not None, "a read worker runs only after _start_worker"
    with unit_of_work(_pool) as conn:
        answer = epoch_energy.job_epochs(conn, cluster, job_id, running=running, max_epochs=max_epochs)
    # orjson, not FastAPI's encoder: a thousand epochs took the encoder longer than reading them.
    return orjson.dumps(answer)


class ReadWorkers:
    """The collector process's heavy-read workers: at most ``workers`` processes, started on first use.
    Callers bound how many reads wait for them (the API's heavy-read turns)."""

    def __init__(self, database_url: str, workers: int, statement_timeout_s: float, niceness: int) -> None:
        self._args = (database_url, statement_timeout_s, niceness)
        self._workers = workers
        self._answer_within_s = statement_timeout_s + 30.0
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None

    def _started(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"),
                                                     initializer=_start_worker, initargs=self._args)
            return self._executor

    def _forget(self, executor: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is executor:
                self._executor = None
        executor.shutdown(wait=False, cancel_futures=True)

    def epochs_json(self, cluster: str, job_id: str, *, running: bool, max_epochs: int) -> bytes:
        """The job's epochs as JSON bytes, read by a worker."""
        executor = self._started()
        try:
            return executor.submit(_epochs_json, cluster, job_id, running, max_epochs).result(self._answer_within_s)
        except BrokenProcessPool as exc:
            self._forget(executor)
            raise DatabaseUnavailable("a read worker stopped while reading; the next read starts another") from exc
        except TimeoutError as exc:
            raise DatabaseUnavailable("a read worker did not answer in time") from exc

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
