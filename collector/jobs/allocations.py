"""The Slurm allocations (and owners) tokens are checked against, kept a short while per process.

Every batch a node daemon sends is checked against its job's allocation (the nodes the prolog
registered), and reading it was one database round trip per request: at a few hundred
requests a second that was the largest single cost of a small batch. An allocation changes
when a prolog registers its job (or Slurm requeues it), so each collector process keeps what it
read for :data:`ALLOCATION_TTL_S` and forgets a job at once when this process stores its
``job_started``. Another process learns of a new allocation within the TTL: until then a node
of the new allocation may be refused (403, which its shipper sets aside like any refusal; a
registration is seconds before the node's first batch, so this is rare) and a node of the old
one still accepted, as it was a moment ago.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from jobsight.collector.store.db import Connection

ALLOCATION_TTL_S: Final = 30.0
"""How long a process trusts an allocation it read."""
MAX_JOBS: Final = 100_000
"""Entries kept at most; beyond, the oldest reads are forgotten first."""

@dataclass(frozen=True, slots=True)
class Registered:
    """A job a prolog registered: the nodes of its Slurm allocation and the uid it runs as (``None``
    where the prolog did not know it)."""

    nodes: tuple[str, ...]
    uid: int | None = None


Allocation = Registered | None
"""A job's registration; ``None``: known, but not registered by a prolog yet."""
Reader = Callable[[str, list[str]], dict[str, Allocation]]
"""Reads the allocations of jobs of a cluster from the database (absent: unknown job)."""


class AllocationCache:
    """Allocations per (cluster, job) with the time they were read. Thread-safe."""

    def __init__(self, ttl_s: float = ALLOCATION_TTL_S, max_jobs: int = MAX_JOBS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_jobs = max_jobs
        self._clock = clock
        self._entries: dict[tuple[str, str], tuple[float, Allocation]] = {}
        self._lock = threading.Lock()

    def cached(self, cluster: str, job_ids: Sequence[str]) -> dict[str, Allocation] | None:
        """The allocations of ``job_ids`` if every one is known and fresh, else ``None``:
        answered without the database, so the caller can skip a trip to a worker thread."""
        now = self._clock()
        found: dict[str, Allocation] = {}
        with self._lock:
            for job in job_ids:
                entry = self._entries.get((cluster, job))
                if entry is None or now - entry[0] >= self.ttl_s:
                    return None
                found[job] = entry[1]
        return found

    def get(self, cluster: str, job_ids: Sequence[str], read: Reader) -> dict[str, Allocation]:
        """The allocations of ``job_ids``: those read less than the TTL ago from memory, the
        rest from ``read`` (one call for all of them). Unknown jobs are absent."""
        now = self._clock()
        found: dict[str, Allocation] = {}
        missing: list[str] = []
        with self._lock:
            for job in job_ids:
                entry = self._entries.get((cluster, job))
                if entry is not None and now - entry[0] < self.ttl_s:
                    found[job] = entry[1]
                else:
                    missing.append(job)
        if not missing:
            return found
        fresh = read(cluster, missing)
        with self._lock:
            for job, allocation in fresh.items():
                self._entries.pop((cluster, job), None)  # re-inserted last: dicts keep insertion order
                self._entries[(cluster, job)] = (now, allocation)
            while len(self._entries) > self.max_jobs:
                del self._entries[next(iter(self._entries))]
        return found | fresh

    def forget(self, cluster: str, job_ids: Iterable[str]) -> None:
        """Drop what is known of these jobs (their allocation is being registered)."""
        with self._lock:
            for job in job_ids:
                self._entries.pop((cluster, job), None)


def job_allocations(conn: Connection, cluster: str, job_ids: list[str]) -> dict[str, Registered | None]:
    """The registration (Slurm allocation and uid) of each known job, as its first prolog wrote it;
    ``None`` for a job known only from other records, not registered yet. Unknown jobs are absent.
    Used to authorise node and job tokens."""
    # A prolog's job_started is what sets user_name (job tokens may not), and it replaces
    # the nodes seen before it with the allocation (ingest._job_started).
    rows = conn.execute(
        """SELECT job_id, user_name IS NOT NULL AS registered, nodes, uid
           FROM jobs WHERE cluster = %s AND job_id = ANY(%s)""",
        (cluster, job_ids),
    ).fetchall()
    return {r["job_id"]: Registered(tuple(r["nodes"] or ()), r["uid"]) if r["registered"] else None for r in rows}
