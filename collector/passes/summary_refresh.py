"""The summary refresh pass: ended jobs' summaries brought up to date with the rows that came after.

An ended job's summary is computed when its ``job_ended`` is stored; a batch of its rows that comes
later only marks it (collector/jobs/summaries.py, :func:`~jobsight.collector.jobs.summaries.mark_stale`),
since recomputing a whole summary in every such batch's transaction held the group commit for as long
as the job was large. This pass, every ``summary_refresh_interval_s`` in the one collector process that
leads (:data:`SUMMARY_REFRESH_LOCK_KEY`), recomputes the marked ones: each at most once per interval,
however many batches marked it. The emissions pass then adds their emissions again.
"""

from __future__ import annotations

import threading
from typing import Any, Final

import psycopg

from jobsight.collector.jobs.summaries import refresh_marked
from jobsight.collector.passes.leader import LeaderTimer

SUMMARY_REFRESH_LOCK_KEY: Final = 0x6A6F6273_73756D6D & 0x7FFFFFFFFFFFFFFF
BATCH: Final = 500
"""Summaries recomputed per pass at most, oldest mark first; the rest wait for the next pass."""


class SummaryRefresher(LeaderTimer[int]):
    """The timer: recomputes marked summaries while this process leads; a pass's result is how many."""

    def __init__(self, database_url: str, interval_s: float) -> None:
        super().__init__(database_url, SUMMARY_REFRESH_LOCK_KEY, "summary-refresh", interval_s)

    def work(self, conn: psycopg.Connection[dict[str, Any]]) -> int:
        return refresh_marked(conn, BATCH)

    def describe(self, result: int) -> str | None:
        return f"{result} ended job summaries recomputed with rows that came after them" if result else None


def start_summary_refresh(database_url: str, interval_s: float, stop: threading.Event) -> None:
    """Run the pass every ``interval_s`` in a daemon thread until ``stop`` is set."""
    threading.Thread(target=SummaryRefresher(database_url, interval_s).run, args=(stop,),
                     name="jobsight-summary-refresh", daemon=True).start()
