"""The collector's own Prometheus metrics (served at ``/metrics``).

One collector process keeps its metrics in a registry of its own. Under ``jobsight
collector --workers N`` every worker is a process, and a scrape reaches whichever worker
accepts it: then (``PROMETHEUS_MULTIPROC_DIR`` set before the workers start, see
:mod:`jobsight.commands.server`) prometheus_client keeps each worker's values in files of
that directory, and ``/metrics`` adds up every worker's files, so any worker answers with
the collector's totals. A worker that has died keeps its counts (counters never go back),
but its live gauges are dropped.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

MULTIPROC_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
REFUSAL_LOG_EVERY_S: Final = 60.0
"""A sender's refused records are logged at most once in this long (the rest counted into the next line)."""

log = logging.getLogger("jobsight.collector")

# prometheus_client names a live gauge's file gauge_<mode>_<pid>.db (mode liveall, livesum...).
_LIVE_GAUGE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


def multiprocess_dir() -> str | None:
    """The shared metrics directory when this process runs in multiprocess mode, else ``None``.

    prometheus_client decides the mode from this variable when it is first imported; the
    command sets it before any worker starts, so reading it again here agrees.
    """
    return os.environ.get(MULTIPROC_DIR_ENV) or None


def clear_multiprocess_dir(path: str) -> None:
    """Remove the value files of an earlier run, which would otherwise be added to this one's."""
    for item in Path(path).glob("*.db"):
        item.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def forget_dead_workers(path: str) -> list[int]:
    """Drop the live gauges of workers that are gone (killed, or restarted by uvicorn), so a
    gauge such as the worker count says what runs now; returns their pids."""
    dead: set[int] = set()
    for item in Path(path).iterdir():
        found = _LIVE_GAUGE_FILE.match(item.name)
        if found is not None and not _alive(int(found.group(1))):
            dead.add(int(found.group(1)))
    for pid in dead:
        mark_process_dead(pid, path)  # type: ignore[no-untyped-call]  # prometheus_client has no hints here
    return sorted(dead)


class RefusalLog:
    """Logs the records a node's batches had refused, at most once per sender every ``every_s``:
    a node that keeps sending records of a job registered elsewhere writes one line a minute, with
    how many were refused since the last, not one per batch."""

    def __init__(self, every_s: float = REFUSAL_LOG_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def note(self, sender: str, count: int, example: str) -> bool:
        """Count ``count`` refused records of ``sender``; log them (with ``example``, one reason) unless a
        line about this sender went out less than ``every_s`` ago. ``True`` when it logged."""
        with self._lock:
            now = self._clock()
            pending = self._unlogged.pop(sender, 0) + count
            last = self._last.get(sender)
            if last is not None and now - last < self.every_s:
                self._unlogged[sender] = pending
                return False
            if len(self._last) > 10_000:  # bounded: the oldest senders are forgotten
                self._last.clear()
            self._last[sender] = now
        log.warning("ingest: %d record(s) from %s refused and dropped (the rest of their batches stored); "
                    "e.g. %r", pending, sender, example)
        return True


class CollectorMetrics:
    """One registry per app, so several apps (tests) can live in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.multiprocess_dir = multiprocess_dir()
        self.records = Counter(
            "jobsight_records_ingested", "Records stored, by kind", ["kind"], registry=self.registry
        )
        self.batches = Counter(
            "jobsight_batches", "Batches received, by outcome (stored, duplicate)", ["outcome"], registry=self.registry
        )
        self.rejects = Counter(
            "jobsight_ingest_rejects", "Batches rejected, by reason", ["reason"], registry=self.registry
        )
        self.refused = Counter(
            "jobsight_ingest_records_refused",
            "Records of node batches the node may not write, dropped while the rest was stored, by kind and rule",
            ["kind", "rule"],
            registry=self.registry,
        )
        self.refusal_log = RefusalLog()
        self.latency = Histogram(
            "jobsight_ingest_batch_seconds",
            "Time to validate and store one batch",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        # livesum: each live worker contributes its 1, and a dead worker's file is dropped.
        self.workers = Gauge(
            "jobsight_collector_workers",
            "Collector worker processes serving (1 without --workers)",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.workers.set(1)

    def note_refused(self, sender: str, refused: Sequence[tuple[str, str, str]]) -> None:
        """Count and log (rate-limited) the ``(kind, rule, reason)`` of records refused from ``sender``'s
        stored batch."""
        for kind, rule, _ in refused:
            self.refused.labels(kind, rule).inc()
        if refused:
            self.refusal_log.note(sender, len(refused), refused[0][2])

    def exposition(self) -> bytes:
        """The text ``/metrics`` answers: this process's registry, or every worker's values."""
        path = self.multiprocess_dir
        if path is None:
            return generate_latest(self.registry)
        forget_dead_workers(path)
        # A fresh registry per scrape, as prometheus_client's multiprocess mode requires: the
        # app's own registry would add this worker's values a second time.
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
