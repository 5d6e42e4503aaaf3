"""A job's training epochs from its step rollup: when each began and ended, its steps and samples.

An epoch begins at its start in ``epoch_starts`` (the end of its earliest training step on any
rank: the time the job page's epoch markers show) and ends where the next epoch, in time order,
begins; the last one ends at the job's last training step. So the epochs tile the training run
with no gap and no overlap, which is what lets their energies add up (:mod:`epoch_energy`).

Steps and samples come from ``step_minutes`` (a row per rank and minute), not from the steps
themselves: a 64-rank job at two steps a second writes 11 M step rows a day and 92 k rows there.
A minute row carries the greatest epoch of its steps. Epochs only go up on a rank, so a minute
whose epoch is the same as the rank's minute before holds that epoch's steps alone; the others
(a rank's first minute, and the minutes where its epoch changes: about one per rank and epoch)
may hold the end of one epoch and the start of the next. Those minutes are counted from the
steps of those ranks in those minutes, exactly, while that reads at most :data:`RAW_STEPS_BUDGET`
step rows; past it (hundreds of ranks, many epochs), each of their minute rows is shared between
the epochs it spans in proportion to time, which is off by the few steps around each boundary.
"""

from __future__ import annotations

import datetime as dt
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from jobsight.collector.query import series as queries
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers.step_rollup import NO_RANK

RAW_STEPS_BUDGET: Final = 100_000
"""Step rows the boundary minutes may read for exact counts; beyond, they are shared by time."""


@dataclass(frozen=True)
class EpochSteps:
    """One epoch of a job: from ``start`` to ``end``, ``steps`` on its busiest rank (in data-parallel
    training every rank makes the same steps) and ``samples`` summed over ranks (``None`` when no
    step said how many samples it took)."""

    epoch: int
    start: dt.datetime
    end: dt.datetime
    steps: int
    samples: int | None


# Every rank's minute rows, each either summed into its epoch (the epoch did not change since
# the rank's minute before) or returned alone, with the job's step count in that minute (for the
# budget). Minutes whose steps had no epoch are left out.
_MINUTES: Final = """
WITH m AS (
    SELECT rank, ts, epoch, steps, samples_sum, first_ts, last_ts,
           epoch IS NOT DISTINCT FROM lag(epoch) OVER w AND row_number() OVER w > 1 AS pure,
           sum(steps) OVER (PARTITION BY ts) AS minute_steps
    FROM step_minutes WHERE job_id = %(job)s AND cluster = %(cluster)s
      AND (%(since)s::timestamptz IS NULL OR ts >= %(since)s)
    WINDOW w AS (PARTITION BY rank ORDER BY ts)
)
SELECT epoch, rank, sum(steps)::int8 AS steps, sum(samples_sum)::int8 AS samples, max(last_ts) AS last_ts,
       true AS pure, NULL::timestamptz AS ts, NULL::timestamptz AS first_ts, NULL::int8 AS minute_steps
FROM m WHERE pure AND epoch IS NOT NULL GROUP BY epoch, rank
UNION ALL
SELECT epoch, rank, steps, samples_sum, last_ts, false, ts, first_ts, minute_steps
FROM m WHERE NOT pure AND epoch IS NOT NULL
"""

# The steps of the given ranks in the given minutes, per epoch and rank: each distinct minute is
# one range of the steps' (job_id, ts) index, read once for all its ranks. The minutes are
# materialised and the lateral fenced (OFFSET 0) to keep it a loop over them: otherwise the
# planner joined the (rank, minute) pairs first and read each minute once per rank.
_MIXED_STEPS: Final = f"""
WITH mixed AS MATERIALIZED (
    SELECT ts, array_agg(rank) AS ranks FROM unnest(%(ranks)s::int4[], %(minutes)s::timestamptz[]) AS m(rank, ts)
    GROUP BY ts
)
SELECT s.epoch, coalesce(s.rank, {NO_RANK}) AS rank, count(*) AS steps, sum(s.samples)::int8 AS samples
FROM mixed CROSS JOIN LATERAL (
    SELECT epoch, rank, samples FROM steps
    WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= mixed.ts AND ts < mixed.ts + interval '1 minute'
      AND coalesce(phase, 'train') = 'train' AND epoch IS NOT NULL AND coalesce(rank, {NO_RANK}) = ANY(mixed.ranks)
    OFFSET 0
) s
GROUP BY s.epoch, coalesce(s.rank, {NO_RANK})
"""

# A job stored before the step rollup existed has no minute rows: its steps are read.
_ALL_STEPS: Final = f"""
SELECT epoch, coalesce(rank, {NO_RANK}) AS rank, count(*) AS steps, sum(samples)::int8 AS samples,
       max(ts) AS last_ts
FROM steps WHERE job_id = %(job)s AND cluster = %(cluster)s AND coalesce(phase, 'train') = 'train'
  AND epoch IS NOT NULL AND (%(since)s::timestamptz IS NULL OR ts >= %(since)s)
GROUP BY epoch, coalesce(rank, {NO_RANK})
"""

@dataclass
class _Count:
    """One rank's steps and samples in one epoch (floats: shared minutes give parts of steps)."""

    steps: float = 0.0
    samples: float | None = None
    """``None`` when no step said how many samples it took."""


Counts = dict[tuple[int, int], _Count]
"""(epoch, rank) → what the rank did in the epoch."""


def _add(counts: Counts, epoch: int, rank: int, steps: float, samples: float | None) -> None:
    count = counts.setdefault((epoch, rank), _Count())
    count.steps += steps
    if samples is not None:
        count.samples = (count.samples or 0.0) + samples


def _shared_by_time(row: dict[str, Any], starts: Sequence[tuple[dt.datetime, int]], times: Sequence[dt.datetime],
                    counts: Counts) -> None:
    """Share one minute row's steps and samples between the epochs its span crosses (by the
    epochs' start times, ``times``: theirs), in proportion to the time it spent in each. The
    epochs it crosses are found by bisection: a job's epoch count is its own to set, and a scan
    of every epoch per row cost rows × epochs."""
    first, last = row["first_ts"], row["last_ts"]
    cuts = times[bisect_right(times, first):bisect_right(times, last)]
    edges = [first, *cuts, last]
    span = (last - first).total_seconds()
    for lo, hi in zip(edges, edges[1:], strict=False):
        share = (hi - lo).total_seconds() / span if span > 0 else 1.0
        index = bisect_right(times, lo) - 1
        epoch = starts[max(index, 0)][1]
        _add(counts, epoch, row["rank"], row["steps"] * share,
             None if row["samples"] is None else row["samples"] * share)


def _counts(conn: Connection, params: dict[str, Any], starts: Sequence[tuple[dt.datetime, int]],
            raw_budget: int) -> tuple[Counts, dt.datetime | None]:
    """Steps and samples per (epoch, rank), and the time of the last step that had an epoch."""
    rows = conn.execute(_MINUTES, params).fetchall()
    if not rows:
        rows = conn.execute(_ALL_STEPS, params).fetchall()
        counts: Counts = {}
        for r in rows:
            _add(counts, r["epoch"], r["rank"], r["steps"], r["samples"])
        return counts, max((r["last_ts"] for r in rows), default=None)
    counts = {}
    mixed = [r for r in rows if not r["pure"]]
    for r in rows:
        if r["pure"]:
            _add(counts, r["epoch"], r["rank"], r["steps"], r["samples"])
    last = max(r["last_ts"] for r in rows)
    minute_steps = {r["ts"]: r["minute_steps"] for r in mixed}
    if sum(minute_steps.values()) <= raw_budget:
        exact = conn.execute(
            _MIXED_STEPS, {**params, "ranks": [r["rank"] for r in mixed], "minutes": [r["ts"] for r in mixed]}
        ).fetchall()
        for r in exact:
            _add(counts, r["epoch"], r["rank"], r["steps"], r["samples"])
    else:
        times = [t for t, _ in starts]
        for r in mixed:
            _shared_by_time(r, starts, times, counts)
    return counts, last


# The latest epoch starts (and one more), with how many there are and when the first began: a read
# lists at most that many, and everything it reads after this is bounded by them, not by the job.
_LATEST_STARTS: Final = """
SELECT epoch, ts, count(*) OVER () AS total, min(ts) OVER () AS first_ts
FROM epoch_starts WHERE job_id = %(job)s AND cluster = %(cluster)s
ORDER BY ts DESC, epoch DESC LIMIT %(limit)s
"""


@dataclass(frozen=True)
class LatestEpochs:
    """The latest epochs of a job (at most as many as asked), and what came before them."""

    epochs: list[EpochSteps]
    left_out: int
    """Earlier epochs not listed."""
    left_out_start: dt.datetime | None
    """When the first of them began (``None``: none left out); they end where ``epochs[0]`` begins."""


def _epochs(conn: Connection, params: dict[str, Any], starts: Sequence[tuple[dt.datetime, int]], listed: int,
            raw_budget: int) -> list[EpochSteps]:
    """The last ``listed`` of ``starts`` (ascending) as epochs; the ones before them only take their
    own steps, so the listed ones count none of theirs."""
    counts, last = _counts(conn, params, starts, raw_budget)
    per_epoch: dict[int, list[_Count]] = defaultdict(list)
    for (epoch, _), count in counts.items():
        per_epoch[epoch].append(count)
    epochs = []
    for index in range(len(starts) - listed, len(starts)):
        start, epoch = starts[index]
        end = starts[index + 1][0] if index + 1 < len(starts) else max(last or start, start)
        ranks = per_epoch.get(epoch, [])
        samples = [c.samples for c in ranks if c.samples is not None]
        epochs.append(EpochSteps(
            epoch=epoch, start=start, end=end, steps=round(max((c.steps for c in ranks), default=0.0)),
            samples=round(sum(samples)) if samples else None,
        ))
    return epochs


def job_epochs(conn: Connection, cluster: str, job_id: str, *, raw_budget: int = RAW_STEPS_BUDGET) -> list[EpochSteps]:
    """The job's epochs in time order (none when its steps carry no epoch)."""
    starts = sorted((r["ts"], r["epoch"]) for r in queries.epoch_starts(conn, cluster, job_id))
    if not starts:
        return []
    return _epochs(conn, {"job": job_id, "cluster": cluster, "since": None}, starts, len(starts), raw_budget)


def latest_epochs(conn: Connection, cluster: str, job_id: str, limit: int, *,
                  raw_budget: int = RAW_STEPS_BUDGET) -> LatestEpochs:
    """The job's last ``limit`` epochs in time order, as :func:`job_epochs` gives them, reading only
    their rows (and the minute before): a job's epoch count is its own to set, a read's cost is not."""
    params: dict[str, Any] = {"job": job_id, "cluster": cluster, "limit": limit + 1}
    rows = conn.execute(_LATEST_STARTS, params).fetchall()
    if not rows:  # a job stored before the step rollup: its epochs come from its steps, every one
        every = job_epochs(conn, cluster, job_id, raw_budget=raw_budget)
        shown = every[-limit:] if every else []
        return LatestEpochs(shown, len(every) - len(shown), every[0].start if len(every) > limit else None)
    starts = sorted((r["ts"], r["epoch"]) for r in rows)
    listed = min(limit, len(starts))
    # From the minute the epoch before the listed ones began: every step of the listed ones is in it.
    since = starts[0][0].replace(second=0, microsecond=0)
    epochs = _epochs(conn, {**params, "since": since}, starts, listed, raw_budget)
    total = rows[0]["total"]
    return LatestEpochs(epochs, total - listed, rows[0]["first_ts"] if total > listed else None)
