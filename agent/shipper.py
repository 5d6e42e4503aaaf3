"""The shipper: one bounded queue and one daemon worker that posts batches to the collector.

``enqueue`` is all the caller's thread ever does: it appends to a queue under a
lock and, at most, sets an :class:`threading.Event`. Everything else (batching,
gzip, HTTP, the disk spool) happens on the worker thread, so telemetry never
blocks or breaks the training loop (STYLE rule 9).

Delivery:

* a batch is sent when ``batch_records`` records are waiting or the oldest has
  waited ``batch_age_s``;
* 200 (``stored`` or ``duplicate``) acknowledges it;
* 4xx: the collector will never take it; it is logged once per status and kept
  in the spool's ``rejected/`` folder, and the batches after it go on;
* 5xx, 429 or a network error: backoff (exponential with jitter, ``Retry-After``
  honoured); the batch and every batch after it go to the disk spool, which is
  replayed in order, with each batch's original ``(source, seq)``, once the
  collector answers again. Segments left by a dead process on this node are
  adopted and replayed too.

When a cap forces a drop (full queue, full spool, a record that is not JSON) the
count is kept per job and reason and sent as a ``dropped`` record; if that
record is itself dropped its count rolls into the next one, so the counts always
add up to what is missing.

After ``os.fork`` the child gets a fresh shipper (new source, empty queue, worker
started on its first ``enqueue``), so a DataLoader worker never re-sends its
parent's records.
"""

from __future__ import annotations

import atexit
import dataclasses
import http.client
import json
import logging
import os
import random
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlparse

from agent import wire
from agent.settings import AgentSettings, load_agent_settings
from agent.spool import BatchStore, MemorySpool, Spool, SpooledBatch

log = logging.getLogger("jobsight.agent.shipper")

ATEXIT_TIMEOUT_S: Final = 2.0
ADOPT_INTERVAL_S: Final = 30.0
MAX_RETRY_AFTER_S: Final = 300.0
REJECT_STATUSES: Final = frozenset({400, 401, 403, 404, 405, 409, 410, 411, 413, 415, 422})

_ACK: Final = "ack"
_REJECT: Final = "reject"
_RETRY: Final = "retry"


@dataclass(frozen=True)
class _Outcome:
    kind: str
    status: int = 0
    detail: str = ""
    retry_after: float | None = None


@dataclass
class ShipperStats:
    sent_batches: int = 0
    sent_records: int = 0
    """Records in acknowledged batches, replays included."""
    spooled_batches: int = 0
    replayed_batches: int = 0
    dropped_records: int = 0
    rejected_batches: int = 0
    duplicate_batches: int = 0


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
        parsed = urlparse(settings.url)
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port
        self._path = parsed.path.rstrip("/") + "/v1/ingest"
        self._init_state()
        _ALL.add(self)

    def _init_state(self) -> None:
        # Everything here is per process: a forked child calls this again.
        self._pid = os.getpid()
        self.source = f"{self.settings.node}:{self._pid}:{wire.now_us()}"
        self._lock = threading.Lock()
        self._settled_cv = threading.Condition(threading.Lock())
        self._wake = threading.Event()
        self._queue: deque[dict[str, Any]] = deque()
        self._oldest: float | None = None
        self._unreported: dict[tuple[str, str], int] = {}
        self._expected = 0
        self._settled = 0
        self._flushers = 0
        self._closed = False
        self._stopping = False
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._store: BatchStore | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._token: str | None = None
        self._backoff_until = 0.0
        self._failures = 0
        self._logged: set[str] = set()
        self._next_adopt = 0.0
        self._stats = ShipperStats()

    # -- the caller's side ---------------------------------------------------------

    def enqueue(self, record: dict[str, Any]) -> None:
        """Queue one wire record (the caller must not change it afterwards). Never blocks or raises."""
        try:
            wake = False
            with self._lock:
                if self._closed:
                    self._stats.dropped_records += 1
                    return
                if not isinstance(record, dict):
                    wake = self._note_drop_locked(None, "not a record", 1)
                elif len(self._queue) >= self.settings.queue_max:
                    wake = self._note_drop_locked(record.get("job"), "queue full", 1)
                else:
                    self._queue.append(record)
                    self._expected += 1
                    if self._oldest is None:
                        self._oldest = time.monotonic()
                        wake = True
                    elif len(self._queue) == self.settings.batch_records:
                        wake = True
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

    def _note_drop_locked(self, job: Any, reason: str, count: int) -> bool:
        """Count dropped records; ``True`` when the worker should be woken to report them."""
        if not isinstance(job, str) or not job:
            job = self.settings.job_id or os.environ.get("JOBSIGHT_JOB_ID") or "unknown"
        self._stats.dropped_records += count
        key = (job, reason)
        if key not in self._unreported:
            self._unreported[key] = 0
            self._expected += 1  # the dropped record that will report it
        self._unreported[key] += count
        if self._oldest is None:
            self._oldest = time.monotonic()
            return True
        return False

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every record queued so far is acknowledged, rejected or dropped.

        ``False`` when ``timeout`` seconds pass first (e.g. the collector is away and
        the records sit in the spool).
        """
        try:
            with self._lock:
                target = self._expected
                if self._thread is None:
                    return self._settled >= target
            deadline = time.monotonic() + timeout
            with self._settled_cv:
                self._flushers += 1
            try:
                self._wake.set()
                with self._settled_cv:
                    while self._settled < target:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return False
                        self._settled_cv.wait(remaining)
                    return True
            finally:
                with self._settled_cv:
                    self._flushers -= 1
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
        self._token = token

    def stats(self) -> dict[str, int]:
        """Counters for tests and benchmarks (``queued`` and ``spool_pending`` are right-now values)."""
        with self._lock:
            values = dict(vars(self._stats))
            values["queued"] = len(self._queue)
        store = self._store
        values["spool_pending"] = store.pending() if store is not None else 0
        return values

    # -- the worker ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._store = self._open_store()
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
            self._close_connection()
            store = self._store
            if store is not None:
                try:
                    store.close()
                except Exception:  # noqa: BLE001 - boundary: closing is best-effort
                    pass

    def _open_store(self) -> BatchStore:
        if self._use_spool:
            try:
                spool = Spool(self.settings.resolved_spool_dir(), self.settings.spool_max_bytes)
                spool.adopt()
                self._next_adopt = time.monotonic() + ADOPT_INTERVAL_S
                return spool
            except OSError as exc:
                log.warning("jobsight: no disk spool (%s); unsent batches are kept in memory", exc)
        return MemorySpool(self.settings.spool_max_bytes)

    def _wait_timeout(self) -> float | None:
        now = time.monotonic()
        waits: list[float] = []
        with self._lock:
            if self._oldest is not None:
                waits.append(self._oldest + self.settings.batch_age_s - now)
        store = self._store
        if store is not None and store.pending():
            waits.append(self._backoff_until - now)
        if self._use_spool:
            waits.append(self._next_adopt - now)
        return max(0.0, min(waits)) if waits else None

    def _cycle(self) -> None:
        store = self._store
        assert store is not None
        if self._use_spool and time.monotonic() >= self._next_adopt:
            store.adopt()
            self._next_adopt = time.monotonic() + ADOPT_INTERVAL_S
        self._form_batches(force=self._flushers > 0)
        self._replay()

    def _drain_for_shutdown(self) -> None:
        self._form_batches(force=True)
        self._replay()
        self._form_batches(force=True)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _form_batches(self, force: bool) -> None:
        size = self.settings.batch_records
        while True:
            with self._lock:
                waiting = len(self._queue)
                if self._oldest is None:
                    return
                aged = time.monotonic() - self._oldest >= self.settings.batch_age_s
                if not (waiting >= size or force or aged):
                    return
                records = [self._queue.popleft() for _ in range(min(waiting, size))]
                drops, self._unreported = self._unreported, {}
                self._oldest = time.monotonic() if self._queue else None
            records.extend(self._dropped_record(job, reason, count) for (job, reason), count in drops.items())
            if records:
                self._dispatch(records)

    def _dropped_record(self, job: str, reason: str, count: int) -> dict[str, Any]:
        return {
            "kind": "dropped",
            "job": job,
            "ts": wire.now_us(),
            "node": self.settings.node,
            "count": count,
            "reason": reason,
        }

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
                self._drop(record, "not JSON-serialisable")
                self._settle(1)
        if not good:
            return None, good
        return wire.encode_batch(self.source, self._seq, good, self.settings.cluster), good

    def _dispatch(self, records: list[dict[str, Any]]) -> None:
        store = self._store
        assert store is not None
        body, records = self._encode(records)
        if body is None:
            return
        batch = SpooledBatch(self.source, self._seq, len(records), body)
        self._seq += 1
        waiting = self._in_backoff() or self._past_deadline()
        if store.pending() or waiting:
            # Older batches are still to go: keep the order by queueing behind them.
            if store.append(batch.source, batch.seq, batch.records, batch.body):
                self._stats.spooled_batches += 1
                return
            if waiting:
                self._drop_batch(records, "spool full")
                return
        outcome = self._post(body)
        if outcome.kind == _RETRY:
            self._enter_backoff(outcome)
            if store.append(batch.source, batch.seq, batch.records, batch.body):
                self._stats.spooled_batches += 1
            else:
                self._drop_batch(records, "spool full")
            return
        self._finish(batch, outcome, store, spooled=False)

    def _replay(self) -> None:
        store = self._store
        assert store is not None
        while not self._in_backoff() and not self._past_deadline():
            batch = store.peek()
            if batch is None:
                return
            outcome = self._post(batch.body)
            if outcome.kind == _RETRY:
                self._enter_backoff(outcome)
                return
            self._stats.replayed_batches += 1
            self._finish(batch, outcome, store, spooled=True)
            # New records keep arriving during a long replay: batch them (behind the backlog).
            self._form_batches(force=False)

    def _finish(self, batch: SpooledBatch, outcome: _Outcome, store: BatchStore, spooled: bool) -> None:
        if outcome.kind == _ACK:
            self._stats.sent_batches += 1
            self._stats.sent_records += batch.records
            if outcome.detail == "duplicate":
                self._stats.duplicate_batches += 1
        else:
            self._stats.rejected_batches += 1
            self._log_once(
                f"status {outcome.status}",
                "jobsight: the collector refused a batch (HTTP %d: %s); it is kept in %s/rejected",
                outcome.status,
                outcome.detail,
                self.settings.resolved_spool_dir(),
            )
            if spooled:
                store.reject(batch, outcome.status, outcome.detail)
            else:
                store.set_aside(batch, outcome.status, outcome.detail)
        if spooled:
            if outcome.kind == _ACK:
                store.ack()
            if batch.source != self.source:
                return  # adopted from another process: not ours to count
        self._settle(batch.records)

    def _drop(self, record: dict[str, Any], reason: str) -> None:
        with self._lock:
            self._note_drop_locked(record.get("job"), reason, 1)

    def _drop_batch(self, records: list[dict[str, Any]], reason: str) -> None:
        with self._lock:
            for record in records:
                if record.get("kind") == "dropped":
                    # Roll an unsent report forward so no drop goes uncounted.
                    count = record.get("count")
                    self._note_drop_locked(record.get("job"), str(record.get("reason")), int(count or 0))
                    self._stats.dropped_records -= int(count or 0)  # already counted once
                else:
                    self._note_drop_locked(record.get("job"), reason, 1)
        self._settle(len(records))

    def _settle(self, count: int) -> None:
        with self._settled_cv:
            self._settled += count
            self._settled_cv.notify_all()

    # -- backoff -----------------------------------------------------------------------

    def _in_backoff(self) -> bool:
        return time.monotonic() < self._backoff_until

    def _enter_backoff(self, outcome: _Outcome) -> None:
        self._failures += 1
        ceiling = min(self._backoff_max_s, self._backoff_base_s * 2 ** min(self._failures - 1, 30))
        delay = random.uniform(ceiling / 2, ceiling)
        if outcome.retry_after is not None:
            delay = max(delay, min(outcome.retry_after, MAX_RETRY_AFTER_S))
        self._backoff_until = time.monotonic() + delay
        if self._failures == 1:
            log.warning(
                "jobsight: collector %s unavailable (%s); spooling and retrying",
                self.settings.url,
                outcome.detail or f"HTTP {outcome.status}",
            )

    def _recovered(self) -> None:
        if self._failures:
            log.info("jobsight: collector %s reachable again", self.settings.url)
        self._failures = 0
        self._backoff_until = 0.0

    # -- HTTP --------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            timeout = self.settings.http_timeout_s
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return self._conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - boundary: closing a broken socket is best-effort
                pass

    def _post(self, body: bytes) -> _Outcome:
        if self._token is None:
            self._token = self.settings.resolved_token()
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        for attempt in (0, 1):
            reused = self._conn is not None and self._conn.sock is not None
            try:
                conn = self._connection()
                conn.request("POST", self._path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self._close_connection()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: one fresh try
                return _Outcome(_RETRY, detail=f"{type(exc).__name__}: {exc}")
            if response.will_close:
                self._close_connection()
            return self._judge(response.status, data, response.getheader("Retry-After"))
        return _Outcome(_RETRY, detail="connection lost")

    def _judge(self, status: int, data: bytes, retry_after: str | None) -> _Outcome:
        detail = _detail(data)
        if status == 200:
            self._recovered()
            return _Outcome(_ACK, status, detail)
        if status in (401, 403):
            self._token = None  # a token file may be replaced; read it again next time
        if status in REJECT_STATUSES or (400 <= status < 500 and status not in (408, 429)):
            self._recovered()
            return _Outcome(_REJECT, status, detail)
        after: float | None = None
        if retry_after:
            try:
                after = max(0.0, float(retry_after))
            except ValueError:
                after = None
        return _Outcome(_RETRY, status, detail or f"HTTP {status}", after)

    def _log_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    # -- fork --------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        store = self._store
        if store is not None:
            try:
                store.abandon()
            except Exception:  # noqa: BLE001 - boundary: the child must come up whatever the parent's state
                pass
        self._conn = None  # the parent's socket: dropped, never closed on its behalf
        self._init_state()


def _detail(data: bytes) -> str:
    """The collector's message: ``detail`` (or ``status`` on success) of its JSON answer."""
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return data[:200].decode("utf-8", "replace")
    if isinstance(parsed, dict):
        value = parsed.get("detail", parsed.get("status", ""))
        return value if isinstance(value, str) else json.dumps(value)[:500]
    return ""


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
