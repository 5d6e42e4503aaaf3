"""When one batch may no longer hold the spool: the poison rule.

A batch the collector answers with 5xx is retried, and every later batch waits behind it
so that replay keeps the order. An answer that is the same every time (a 500 from a record
that trips a bug or a constraint) would hold the head of the spool for good, and with it
every later batch, this process's and those of later processes sharing the spool. So a
batch is **quarantined** (set aside in the spool's ``rejected/`` folder, like a 4xx, and
reported as a ``dropped`` record) once both hold:

* it has had ``poison_tries`` answers with the same non-transient status, and
* ``poison_after_s`` seconds have passed since the first of them.

*Transient* answers never count: no answer at all (status 0), 502 and 504 (a proxy), 503
(the collector's database is away), 408, 429, and any answer carrying ``Retry-After`` (the
server says "later"). They neither count as a try nor break the streak: an outage in the
middle of a streak says nothing about the batch. Another non-transient status starts a
new streak. Only the status is compared, so a 500 whose body carries a fresh request id
each time is still the same answer.

The count lives in memory: a process that adopts a dead one's segments counts its own
tries of each batch, from zero, by the same rule.
"""

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from jobsight.agent.shipping.outcomes import Outcome
from jobsight.agent.shipping.spool_format import SpooledBatch

TRANSIENT_STATUSES: Final = frozenset({0, 408, 429, 502, 503, 504})
"""Answers that say "not now" rather than "not this batch"."""


def is_transient(outcome: Outcome) -> bool:
    """Whether a ``retry`` outcome says nothing about the batch itself."""
    return outcome.status in TRANSIENT_STATUSES or outcome.retry_after is not None


@dataclass
class _Streak:
    key: tuple[str, int]
    """The batch's ``(source, seq)``."""
    status: int
    tries: int
    since: float
    """Clock reading at the first try of the streak."""


class PoisonWatch:
    """Counts the failures of the batch at the head of delivery (one at a time: replay is in order)."""

    def __init__(self, tries: int, after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.tries = tries
        self.after_s = after_s
        self._clock = clock
        self._streak: _Streak | None = None

    def failed(self, batch: SpooledBatch, outcome: Outcome) -> str | None:
        """Note one ``retry`` outcome of ``batch``: the reason to quarantine it now, or ``None``
        to keep retrying."""
        if is_transient(outcome):
            return None
        now = self._clock()
        key = (batch.source, batch.seq)
        streak = self._streak
        if streak is None or streak.key != key or streak.status != outcome.status:
            streak = self._streak = _Streak(key, outcome.status, 0, now)
        streak.tries += 1
        waited = now - streak.since
        if streak.tries < self.tries or waited < self.after_s:
            return None
        self._streak = None
        answer = f"HTTP {outcome.status} {short(outcome.detail)}".rstrip()
        return f"quarantined after {streak.tries} tries over {waited:.0f} s: {answer}"

    def forget(self) -> None:
        """The head batch was acknowledged or refused: its streak is over."""
        self._streak = None


def short(detail: str) -> str:
    """The collector's error message without what changes every time (a 500's request id)."""
    try:
        parsed = json.loads(detail)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return str(parsed["error"])[:200]
    return detail[:200]


def records_of(batch: SpooledBatch) -> list[dict[str, Any]]:
    """The records of an encoded batch, to report what quarantine drops, job by job.

    A body that cannot be read gives ``batch.records`` empty records: they are still
    counted, under the reporting process's job.
    """
    try:
        envelope = json.loads(gzip.decompress(batch.body))
        records = envelope["records"]
        if isinstance(records, list) and all(isinstance(r, dict) for r in records):
            return records
    except (OSError, EOFError, zlib.error, ValueError, TypeError, KeyError):
        pass
    return [{} for _ in range(batch.records)]
