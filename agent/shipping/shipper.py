"""The shipper: one bounded queue and one daemon worker that posts batches to the collector.

``enqueue`` is all the caller's thread ever does: it appends to a queue under a
lock and, at most, sets an :class:`threading.Event`. Everything else (batching,
gzip, HTTP, the disk spool) happens on the worker thread, so telemetry never
blocks or breaks the training loop (CONTRIBUTING rule 9).

A batch is sent when ``batch_records`` records are waiting or the oldest has
waited ``batch_age_s``; what happens to it then is :mod:`jobsight.agent.shipping.delivery`'s
business (post, or spool while the collector is away, and replay). What is
dropped, and why, is counted in :mod:`jobsight.agent.shipping.record_queue` and reported to the
collector as ``dropped`` records.

After ``os.fork`` the child gets a fresh shipper (new source, empty queue, worker
started on its first ``enqueue``), so a DataLoader worker never re-sends its
parent's records.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import threading
import time
import weakref
from typing import Any, Final

from jobsight.agent.settings import AgentSettings, load_agent_settings
from jobsight.agent.shipping.client import CollectorClient
from jobsight.agent.shipping.delivery import Delivery
from jobsight.agent.shipping.record_queue import RecordQueue
from jobsight.agent.shipping.spool_format import SpooledBatch
from jobsight.agent.shipping.stats import ShipperStats
from jobsight.protocol import wire

log = logging.getLogger("jobsight.agent.shipper")

ATEXIT_TIMEOUT_S: Final = 2.0


class Shipper:
    """Ships records to the collector; see the module docstring.

    ``use_spool=False`` keeps unsent batches in memory only (still capped by
    ``spool_max_bytes``). ``backoff_base_s``/``backoff_max_s`` bound the wait between
    attempts while the collector is away.
    """

    def __init__(
        self,
        settings: AgentSettings,
        *,
        use_spool: bool = True,
        backoff_base_s: float = 0.25,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.settings = settings
        self._use_spool = use_spool
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._init_state()
        _ALL.add(self)

    def _init_state(self) -> None:
        # Everything here is per process: a forked child calls this again.
        self._pid = os.getpid()
        self.source = f"{self.settings.node}:{self._pid}:{wire.now_us()}"
        self._stats = ShipperStats()
        self._queue = RecordQueue(self.settings, self._stats)
        # One lock for the queue and the worker's life, so a record is never queued
        # after shutdown, nor a worker started twice.
        self._lock = self._queue.lock
        self._wake = threading.Event()
        self._closed = False
        self._stopping = False
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._client = CollectorClient(
            self.settings, backoff_base_s=self._backoff_base_s, backoff_max_s=self._backoff_max_s
        )
        self._delivery = Delivery(
            self.settings,
            self._client,
            self._stats,
            source=self.source,
            settle=self._queue.settle,
            report_drops=self._queue.drop_set_aside,
            use_spool=self._use_spool,
        )

    # -- the caller's side ---------------------------------------------------------

    def enqueue(self, record: dict[str, Any]) -> None:
        """Queue one wire record (the caller must not change it afterwards). Never blocks or raises."""
        try:
            wake = False
            with self._lock:
                if self._closed:
                    self._stats.dropped_records += 1
                    return
                wake = self._queue.put_locked(record)
                if self._thread is None:
                    self._start_locked()
            if wake:
                self._wake.set()
        except Exception:  # noqa: BLE001 - boundary: telemetry must never break the caller
            pass

    def start(self) -> None:
        """Start the worker now rather than on the first ``enqueue``: to replay a spool left
        by an earlier process (the node daemon does this at boot)."""
        with self._lock:
            if self._thread is None and not self._closed:
                self._start_locked()

    def _start_locked(self) -> None:
        thread = threading.Thread(target=self._run, name="jobsight-shipper", daemon=True)
        self._thread = thread
        thread.start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every record queued so far is acknowledged, rejected or dropped.

        ``False`` when ``timeout`` seconds pass first (e.g. the collector is away and
        the records sit in the spool).
        """
        try:
            with self._lock:
                target = self._queue.expected
                if self._thread is None:
                    return self._queue.settled >= target
            return self._queue.wait_settled(target, timeout, self._wake.set)
        except Exception:  # noqa: BLE001 - boundary: never raise into the caller
            return False

    def shutdown(self, timeout: float = 5.0) -> None:
        """Send what can be sent within ``timeout``, spool the rest, stop the worker. Safe twice."""
        try:
            with self._lock:
                if self._closed:
                    thread = self._thread
                else:
                    self._closed = True
                    self._deadline = time.monotonic() + timeout
                    self._stopping = True
                    thread = self._thread
            self._wake.set()
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout + 1.0)
        except Exception:  # noqa: BLE001 - boundary: never raise into the caller
            pass

    def set_token(self, token: str) -> None:
        """Use ``token`` from the next request on (the node daemon re-mints before expiry)."""
        self.settings = dataclasses.replace(self.settings, token=token)
        self._client.set_token(token)

    def stats(self) -> dict[str, int]:
        """Counters for tests and benchmarks (``queued`` and ``spool_pending`` are right-now values)."""
        with self._lock:
            values = dict(vars(self._stats))
            values["queued"] = len(self._queue)
        store = self._delivery.store
        values["spool_pending"] = store.pending() if store is not None else 0
        return values

    # -- the worker ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._delivery.open()
            while True:
                self._wake.wait(self._wait_timeout())
                self._wake.clear()
                if self._stopping:
                    self._drain_for_shutdown()
                    return
                self._cycle()
        except Exception:  # boundary: the worker dies quietly rather than crash the job
            log.exception("jobsight: shipper worker stopped")
        finally:
            self._delivery.close()

    def _wait_timeout(self) -> float | None:
        now = time.monotonic()
        waits: list[float] = []
        due = self._queue.due_in(now)
        if due is not None:
            waits.append(due)
        waits.extend(self._delivery.waits(now))
        return max(0.0, min(waits)) if waits else None

    def _cycle(self) -> None:
        self._delivery.adopt_if_due()
        self._form_batches(force=self._queue.flushers > 0)
        self._replay()

    def _drain_for_shutdown(self) -> None:
        self._form_batches(force=True)
        self._replay()
        self._form_batches(force=True)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _form_batches(self, force: bool) -> None:
        while (records := self._queue.take_batch(force)) is not None:
            if records:
                self._dispatch(records)

    def _encode(self, records: list[dict[str, Any]]) -> tuple[bytes | None, list[dict[str, Any]]]:
        try:
            return wire.encode_batch(self.source, self._seq, records, self.settings.cluster), records
        except (TypeError, ValueError):
            pass
        good: list[dict[str, Any]] = []
        for record in records:
            try:
                json.dumps(record, allow_nan=False)
                good.append(record)
            except (TypeError, ValueError):
                self._queue.drop(record, "not JSON-serialisable")
                self._queue.settle(1)
        if not good:
            return None, good
        return wire.encode_batch(self.source, self._seq, good, self.settings.cluster), good

    def _dispatch(self, records: list[dict[str, Any]]) -> None:
        body, records = self._encode(records)
        if body is None:
            return
        batch = SpooledBatch(self.source, self._seq, len(records), body)
        self._seq += 1
        if not self._delivery.send(batch, past_deadline=self._past_deadline()):
            self._queue.drop_batch(records, "spool full")

    def _replay(self) -> None:
        while not self._client.in_backoff() and not self._past_deadline():
            if not self._delivery.replay_one():
                return
            # New records keep arriving during a long replay: batch them (behind the backlog).
            self._form_batches(force=False)

    # -- fork --------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        self._delivery.abandon()
        self._init_state()


_ALL: weakref.WeakSet[Shipper] = weakref.WeakSet()
_singleton: Shipper | None = None
_singleton_lock = threading.Lock()


def get_shipper(settings: AgentSettings | None = None) -> Shipper:
    """The process-wide shipper, made on first use from ``settings`` (default: the environment).

    Later calls return the same shipper and ignore ``settings``.
    """
    global _singleton
    shipper = _singleton
    if shipper is not None:
        return shipper
    with _singleton_lock:
        if _singleton is None:
            _singleton = Shipper(settings if settings is not None else load_agent_settings())
        return _singleton


def _after_fork_in_child() -> None:
    global _singleton_lock
    _singleton_lock = threading.Lock()
    for shipper in list(_ALL):
        shipper._after_fork_in_child()


def _shutdown_all() -> None:
    for shipper in list(_ALL):
        shipper.shutdown(ATEXIT_TIMEOUT_S)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown_all)
