"""The shipper's bounded queue: records waiting for the worker, drops not yet reported,
and the count of settled records that ``flush`` waits on.

When a cap forces a drop (full queue, full spool, a record that is not JSON), or a
batch is quarantined (:mod:`jobsight.agent.shipping.poison`), the count is kept per
job and reason and sent as a ``dropped`` record; if that record is itself dropped
its count rolls into the next one, so the counts always add up to what is missing.

Every record taken in, and every ``dropped`` record promised, is *expected*;
each is later *settled* (acknowledged, refused or dropped). ``flush`` waits for
the settled count to reach what was expected when it was called.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.stats import ShipperStats
from jobsight.protocol import wire


class RecordQueue:
    """See the module docstring.

    ``lock`` guards everything here except the settled count, which has its own
    condition so that settling never waits behind a caller. Methods named
    ``*_locked`` expect the caller to hold ``lock``.
    """

    def __init__(self, settings: AgentSettings, stats: ShipperStats) -> None:
        self.settings = settings
        self.stats = stats
        self.lock = threading.Lock()
        self._settled_cv = threading.Condition(threading.Lock())
        self._records: deque[dict[str, Any]] = deque()
        self._oldest: float | None = None
        self._unreported: dict[tuple[str, str], int] = {}
        self.expected = 0
        self.settled = 0
        self.flushers = 0
        """How many ``flush`` calls are waiting: the worker then sends without waiting for a full batch."""

    def __len__(self) -> int:
        return len(self._records)

    def put_locked(self, record: dict[str, Any]) -> bool:
        """Queue one record, or count it as dropped; ``True`` when the worker should be woken."""
        if not isinstance(record, dict):
            return self.note_drop_locked(None, "not a record", 1)
        if len(self._records) >= self.settings.queue_max:
            return self.note_drop_locked(record.get("job"), "queue full", 1)
        self._records.append(record)
        self.expected += 1
        if self._oldest is None:
            self._oldest = time.monotonic()
            return True
        return len(self._records) == self.settings.batch_records

    def note_drop_locked(self, job: Any, reason: str, count: int) -> bool:
        """Count dropped records; ``True`` when the worker should be woken to report them."""
        if not isinstance(job, str) or not job:
            job = self.settings.job_id or os.environ.get("JOBSIGHT_JOB_ID") or "unknown"
        self.stats.dropped_records += count
        key = (job, reason)
        if key not in self._unreported:
            self._unreported[key] = 0
            self.expected += 1  # the dropped record that will report it
        self._unreported[key] += count
        if self._oldest is None:
            self._oldest = time.monotonic()
            return True
        return False

    def drop(self, record: dict[str, Any], reason: str) -> None:
        with self.lock:
            self.note_drop_locked(record.get("job"), reason, 1)

    def drop_batch(self, records: list[dict[str, Any]], reason: str) -> None:
        """Count a batch that could be neither sent nor kept as dropped, and settle it."""
        with self.lock:
            self._note_records_locked(records, reason, None)
        self.settle(len(records))

    def drop_set_aside(self, records: list[dict[str, Any]], reason: str) -> None:
        """Count the records of a batch set aside unsent (quarantined) as dropped, so the
        collector hears of them. Settling is the caller's: a batch adopted from another
        process was never expected here.

        Such a batch may hold another job's records. When this process has a job
        (``job_id``), they are reported under it, their job named in the reason: a job
        token writes its own job only, and a refused report would take the good records
        batched with it down too.
        """
        with self.lock:
            self._note_records_locked(records, reason, self.settings.job_id)

    def _note_records_locked(self, records: list[dict[str, Any]], reason: str, own_job: str | None) -> None:
        for record in records:
            job = record.get("job")
            dropped = record.get("kind") == "dropped"
            why = str(record.get("reason")) if dropped else reason
            if own_job and isinstance(job, str) and job != own_job:
                why, job = f"{why} (records of job {job})", own_job
            if dropped:
                # Roll an unsent report forward so no drop goes uncounted.
                count = record.get("count")
                count = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
                self.note_drop_locked(job, why, count)
                self.stats.dropped_records -= count  # not a new drop: only its report moves on
            else:
                self.note_drop_locked(job, why, 1)

    def due_in(self, now: float) -> float | None:
        """Seconds until the oldest waiting record is due to be sent; ``None`` when nothing waits."""
        with self.lock:
            if self._oldest is None:
                return None
            return self._oldest + self.settings.batch_age_s - now

    def take_batch(self, force: bool) -> list[dict[str, Any]] | None:
        """The next batch (with ``dropped`` reports) if one is due, else ``None``.

        Due means ``batch_records`` are waiting, the oldest has waited ``batch_age_s``,
        or ``force``. The list may be empty.
        """
        size = self.settings.batch_records
        with self.lock:
            waiting = len(self._records)
            if self._oldest is None:
                return None
            aged = time.monotonic() - self._oldest >= self.settings.batch_age_s
            if not (waiting >= size or force or aged):
                return None
            records = [self._records.popleft() for _ in range(min(waiting, size))]
            drops, self._unreported = self._unreported, {}
            self._oldest = time.monotonic() if self._records else None
        records.extend(self._dropped_record(job, reason, count) for (job, reason), count in drops.items())
        return records

    def _dropped_record(self, job: str, reason: str, count: int) -> dict[str, Any]:
        return {
            "kind": "dropped",
            "job": job,
            "ts": wire.now_us(),
            "node": self.settings.node,
            "count": count,
            "reason": reason,
        }

    def settle(self, count: int) -> None:
        with self._settled_cv:
            self.settled += count
            self._settled_cv.notify_all()

    def wait_settled(self, target: int, timeout: float, wake: Callable[[], None]) -> bool:
        """Wait until ``target`` records are settled, calling ``wake`` once counted as a flusher;
        ``False`` when ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        with self._settled_cv:
            self.flushers += 1
        try:
            wake()
            with self._settled_cv:
                while self.settled < target:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._settled_cv.wait(remaining)
                return True
        finally:
            with self._settled_cv:
                self.flushers -= 1
