"""Group commit: the batches that arrive together in one collector process share one
transaction, one COPY per table, one upsert per rollup and one summary check.

Per request, the cost of ingest used to be a transaction, a write of the job's row (which
every node of the job waits on), the rollup upsert and the summary check. Here a request
that has decoded, authorised and made the partitions of its batch hands it to
:meth:`GroupCommitter.submit` and waits; a writer thread takes what is queued and stores it
with :func:`jobsight.collector.ingest.write.store_group` in one unit of work, then answers every
request of the group, only after the commit. There are ``writers`` such threads (2 by
default), each writing its own groups on its own connection: while one waits for the
database, the next group is being written.

How a group forms: a writer takes the first queued batch and, while other requests are on
their way (decoding, being authorised) and fewer than ``max_batches`` batches and
``max_records`` records are gathered, waits for them, at most ``wait_s`` after the first
was queued (one writer gathers at a time, so groups are not split). While the writers are
busy, the next group gathers by itself, so a loaded collector writes large groups without
waiting and a quiet one does not wait at all.

What each request still gets, as if it were alone:

* idempotency: its ``(source, seq)`` is claimed in the transaction that stores its rows; a
  replay (in the same group or another) answers ``duplicate`` and stores nothing;
* all or nothing: when the group's transaction fails for a reason that may be one batch's
  (a value the database refuses, a trigger, a constraint, a deadlock), its batches are
  stored again one by one, each in its own transaction, so the failing one gets its own
  answer (422 for a refused value, 500 for the unexpected) and the others are stored. When
  the database is away, every request of the group gets 503.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg_pool import ConnectionPool

from jobsight.collector.ingest import write as ingest
from jobsight.collector.ingest.rows import PreparedBatch
from jobsight.collector.jobs import jobs_seen
from jobsight.collector.jobs.jobs_seen import JobsSeen
from jobsight.collector.store.db import Connection, DatabaseUnavailable, unit_of_work
from jobsight.collector.tiers.step_rollup import EpochsSeen
from jobsight.protocol.wire import Batch

log = logging.getLogger("jobsight.collector")

STOP_TIMEOUT_S: Final = 30.0
QUEUE_LIMIT_GROUPS: Final = 16
"""Batches queued beyond this many full groups are refused (503) rather than held."""
IDLE_WAKE_S: Final = 0.5
"""An idle writer wakes at least this seldom (to flush pending ``last_seen`` times)."""


@dataclass(slots=True)
class _Queued:
    batch: Batch
    prepared: PreparedBatch
    future: Future[bool]
    queued_at: float


@dataclass(slots=True)
class Arrival:
    """A request on its way to :meth:`GroupCommitter.submit` (the writer may wait for it)."""

    submitted: bool = False


class GroupCommitter:
    """The queue of one collector process and the threads that write it, group by group."""

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        *,
        wait_s: float,
        max_batches: int,
        max_records: int,
        jobs: JobsSeen,
        flush_every_s: float,
        writers: int = 1,
        epochs: EpochsSeen | None = None,
    ) -> None:
        self.pool = pool
        self.writers = writers
        self.wait_s = wait_s
        self.max_batches = max_batches
        self.max_records = max_records
        self.jobs = jobs
        self.epochs = epochs if epochs is not None else EpochsSeen()
        self._seen = ingest.Seen(jobs, self.epochs)
        self.flush_every_s = flush_every_s
        self._queue: deque[_Queued] = deque()
        self._queued_records = 0
        self._arriving = 0
        """Requests between their start and :meth:`submit`."""
        self._cond = threading.Condition()
        self._stopping = False
        self._gathering = False
        """A writer is forming a group; the others wait, so that groups are not split."""
        self._threads: list[threading.Thread] = []
        self._flushing = threading.Lock()
        self._flushed_at = 0.0

    # -- request side ------------------------------------------------------------------

    @contextmanager
    def arriving(self) -> Iterator[Arrival]:
        """Around a request from its start to :meth:`submit`: while any is inside, a forming
        group waits for it (up to ``wait_s``); none inside, the group goes at once."""
        arrival = Arrival()
        with self._cond:
            self._arriving += 1
        try:
            yield arrival
        finally:
            if not arrival.submitted:
                with self._cond:
                    self._arriving -= 1
                    self._cond.notify_all()

    def submit(self, arrival: Arrival, batch: Batch, prepared: PreparedBatch) -> Future[bool]:
        """Queue a batch; the future is ``True`` (stored) or ``False`` (a replay) once its
        group has committed, or holds the error of its own transaction."""
        future: Future[bool] = Future()
        with self._cond:
            if self._stopping or not any(thread.is_alive() for thread in self._threads):
                raise DatabaseUnavailable("the collector is stopping")
            if len(self._queue) >= QUEUE_LIMIT_GROUPS * self.max_batches:
                # The database is not keeping up: 503 with Retry-After, as when it is away,
                # rather than holding ever more decoded batches in memory.
                raise DatabaseUnavailable("the ingest queue is full")
            arrival.submitted = True
            self._arriving -= 1
            self._queue.append(_Queued(batch, prepared, future, time.monotonic()))
            self._queued_records += len(batch.records)
            self._cond.notify_all()
        return future

    @property
    def queued(self) -> int:
        """Batches waiting for the writer."""
        with self._cond:
            return len(self._queue)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._flushed_at = time.monotonic()
        self._threads = [
            threading.Thread(target=self._run, name=f"jobsight-group-commit-{n}", daemon=True)
            for n in range(self.writers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Write what is queued, flush pending ``last_seen`` times, and end the writers."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(STOP_TIMEOUT_S)
        self._flush()

    # -- writer threads ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            group = self._gather()
            if group:
                self._write(group)
            if time.monotonic() - self._flushed_at >= self.flush_every_s:
                self._flush()
            if not group and self._stopping:
                return

    def _gather(self) -> list[_Queued]:
        """The next group: empty when there has been nothing to write for a while or the
        committer is stopping with an empty queue."""
        with self._cond:
            while self._gathering and not self._stopping:
                self._cond.wait()
            if not self._queue and not self._stopping:
                self._cond.wait(max(self.flush_every_s, IDLE_WAKE_S))
            if not self._queue or self._gathering:
                return []
            self._gathering = True
            try:
                return self._take()
            finally:
                self._gathering = False
                self._cond.notify_all()

    def _take(self) -> list[_Queued]:
        """Wait for the requests on their way (up to ``wait_s`` after the first batch was
        queued, or until a group is full), then take a group off the queue."""
        deadline = self._queue[0].queued_at + self.wait_s
        while self._arriving > 0 and not self._stopping and not self._full():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
        group: list[_Queued] = []
        records = 0
        while self._queue and len(group) < self.max_batches:
            size = len(self._queue[0].batch.records)
            if group and records + size > self.max_records:
                break
            queued = self._queue.popleft()
            self._queued_records -= size
            # A request cancelled while queued (its client went away) is not written: it had
            # no answer, so its sender retries it.
            if queued.future.set_running_or_notify_cancel():
                group.append(queued)
                records += size
        return group

    def _full(self) -> bool:
        return len(self._queue) >= self.max_batches or self._queued_records >= self.max_records

    def _write(self, group: list[_Queued]) -> None:
        try:
            written = self._store(group)
        except DatabaseUnavailable as exc:
            # A deadlock or serialization failure is worth one more try, batch by batch; a
            # database that is away is nothing any batch can change.
            if len(group) == 1 or not isinstance(exc.__cause__, psycopg.errors.TransactionRollback):
                for queued in group:
                    queued.future.set_exception(exc if len(group) == 1 else _unavailable(str(exc), exc.__cause__))
                return
        except Exception as exc:  # noqa: BLE001 - boundary: a failure that may be one batch's, answered below
            if len(group) == 1:
                group[0].future.set_exception(exc)
                return
            log.info("a group of %d batches failed (%s); storing them one by one", len(group), exc)
        except BaseException as exc:  # the writer is going down: no request may wait for ever
            for queued in group:
                queued.future.set_exception(_unavailable("the collector is stopping", exc))
            raise
        else:
            self._answer(group, written)
            return
        for queued in group:
            try:
                written = self._store([queued])
            except Exception as exc:  # noqa: BLE001 - boundary: this batch's own answer (422, 500, 503)
                queued.future.set_exception(exc)
            else:
                self._answer([queued], written)

    def _store(self, group: list[_Queued]) -> ingest.Written:
        with unit_of_work(self.pool) as conn:
            return ingest.store_group(conn, [(q.batch, q.prepared) for q in group], self._seen)

    def _answer(self, group: list[_Queued], written: ingest.Written) -> None:
        """After the commit: answer the requests, then note the job rows' times and the epoch
        starts as written."""
        for queued, stored in zip(group, written.stored, strict=True):
            queued.future.set_result(stored)
        try:
            self.jobs.committed(written.spans, written.jobs)
            self.epochs.committed(written.epochs)
        except Exception:  # boundary: at worst job rows and epoch starts are written more often than needed
            log.exception("could not note the job rows and epoch starts written")

    def _flush(self) -> None:
        if not self._flushing.acquire(blocking=False):
            return  # another writer is at it
        try:
            self._flushed_at = time.monotonic()
            times = self.jobs.unflushed()
            if times:
                with unit_of_work(self.pool) as conn:
                    jobs_seen.flush(conn, times)
            self.jobs.flushed(times)
        except DatabaseUnavailable:
            pass  # an outage, said once where it is met (store/db.py); they stay pending for the next flush
        except Exception:  # boundary: they stay pending, and the next flush writes them
            log.warning("could not write jobs' last_seen; will retry", exc_info=True)
        finally:
            self._flushing.release()


def _unavailable(message: str, cause: BaseException | None) -> DatabaseUnavailable:
    """A fresh 503 for each request of a group (one exception object raised in many requests
    at once would collect all their tracebacks)."""
    fresh = DatabaseUnavailable(message)
    fresh.__cause__ = cause
    return fresh
