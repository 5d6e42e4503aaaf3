"""The per-minute step rollup (``step_minutes``) and epoch starts (``epoch_starts``), folded
into each ingest transaction.

Training steps (``phase`` 'train' or none) are summed per (job, rank, minute) in Python when a
batch is prepared (:meth:`StepRollup.add_rows`, in the decode thread), which also notes the
earliest step of each (job, epoch). The group commit merges the rollups of every batch it writes
and adds them to the stored rows with one ``INSERT … ON CONFLICT DO UPDATE``
(:func:`upsert_minutes`), as :mod:`jobsight.collector.tiers.rollup` does for GPU samples: sums, counts
and extremes, so the result does not depend on how steps were split into batches and groups.

Epoch starts are different: every rank's batches carry the epoch, so writing its row in every
transaction would make all the ranks of a job queue on that one row. :class:`EpochsSeen`
remembers the earliest start this process has committed per (cluster, job, epoch), and a group
writes a start only when it is earlier (:func:`upsert_epoch_starts`).

Rows are written in key order, so that concurrent groups lock them in the same order.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from jobsight.collector.store.db import Connection
from jobsight.collector.store.schema import steps
from jobsight.collector.store.timestamps import MINUTE_US, day_of_us, ts_from_us
from jobsight.collector.tiers.rollup import merge_keyed

NO_RANK: Final = -1
"""The ``rank`` under which steps without one are stored (a key column cannot be NULL)."""

Key = tuple[str, int, int]
"""job, rank (:data:`NO_RANK` for none), minute (µs since the epoch)."""
ClusterKey = tuple[str, str, int, int]
"""The cluster, then a :data:`Key`: what one ``step_minutes`` row is keyed by."""
EpochKey = tuple[str, str, int]
"""cluster, job, epoch: what one ``epoch_starts`` row is keyed by."""

# Positions in a steps row (ingest_rows builds rows in the table's column order).
_AT: Final = {column.name: i for i, column in enumerate(steps.columns)}
_JOB, _RANK, _STEP, _EPOCH, _PHASE = (_AT[n] for n in ("job_id", "rank", "step", "epoch", "phase"))
_DURATION, _DATA_WAIT, _SAMPLES, _FORWARD = (_AT[n] for n in ("duration_s", "data_wait_s", "samples", "forward_s"))


@dataclass(slots=True)
class StepSums:
    first_ts: int
    """µs since the epoch, like ``last_ts``; converted when written."""
    last_ts: int
    last_step: int
    steps: int = 0
    duration_sum: float = 0.0
    duration_max: float = 0.0
    data_wait_sum: float | None = None
    """``None`` when no step of the minute had a data wait (as SQL's ``sum`` of none)."""
    samples_sum: int | None = None
    epoch: int | None = None
    forward_sum: float | None = None
    """Sum of the steps' ``forward_s``, over ``forward_n`` steps (``None``: none had one)."""
    forward_n: int | None = None


def _add(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else a + b


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def combined(a: StepSums, b: StepSums) -> StepSums:
    """A new sum of ``a`` and ``b`` (neither is changed: a batch keeps its own rollup, for
    when its group falls back to storing batch by batch)."""
    return StepSums(
        min(a.first_ts, b.first_ts), max(a.last_ts, b.last_ts), max(a.last_step, b.last_step), a.steps + b.steps,
        a.duration_sum + b.duration_sum, max(a.duration_max, b.duration_max), _add(a.data_wait_sum, b.data_wait_sum),
        _add(a.samples_sum, b.samples_sum), _max(a.epoch, b.epoch), _add(a.forward_sum, b.forward_sum),
        _add(a.forward_n, b.forward_n),
    )


@dataclass
class StepRollup:
    """Accumulates one batch's training steps: minute sums and epoch starts."""

    sums: dict[Key, StepSums] = field(default_factory=dict)
    epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    """(job, epoch): the time of its earliest training step in the batch (µs since the epoch)."""

    def add_rows(self, rows: Sequence[tuple[Any, ...]], ts_us: Sequence[int]) -> None:
        """Fold ``steps`` rows in, ``ts_us`` being their times as integers; steps of another
        phase than training are left out. Inline and on locals: this runs once per step."""
        sums, epochs = self.sums, self.epochs
        for row, us in zip(rows, ts_us, strict=True):
            phase = row[_PHASE]
            if phase is not None and phase != "train":
                continue
            rank = row[_RANK]
            key = (row[_JOB], NO_RANK if rank is None else rank, us - us % MINUTE_US)
            step, duration, epoch = row[_STEP], row[_DURATION], row[_EPOCH]
            s = sums.get(key)
            if s is None:
                s = sums[key] = StepSums(us, us, step, duration_max=duration)
            else:
                if us < s.first_ts:
                    s.first_ts = us
                elif us > s.last_ts:
                    s.last_ts = us
                if step > s.last_step:
                    s.last_step = step
                if duration > s.duration_max:
                    s.duration_max = duration
            s.steps += 1
            s.duration_sum += duration
            if (wait := row[_DATA_WAIT]) is not None:
                s.data_wait_sum = wait if s.data_wait_sum is None else s.data_wait_sum + wait
            if (samples := row[_SAMPLES]) is not None:
                s.samples_sum = samples if s.samples_sum is None else s.samples_sum + samples
            if (forward := row[_FORWARD]) is not None:
                if s.forward_sum is None:
                    s.forward_sum, s.forward_n = forward, 1
                else:
                    s.forward_sum += forward
                    s.forward_n = (s.forward_n or 0) + 1
            if epoch is not None:
                if s.epoch is None or epoch > s.epoch:
                    s.epoch = epoch
                seen = epochs.get(ek := (row[_JOB], epoch))
                if seen is None or us < seen:
                    epochs[ek] = us

    def days(self) -> set[dt.date]:
        return {day_of_us(key[2]) for key in self.sums}


def merged(parts: Iterable[tuple[str, StepRollup]]) -> dict[ClusterKey, StepSums]:
    """The rollups of several batches (with their clusters) as one set of ``step_minutes`` rows."""
    return merge_keyed(((cluster, rollup.sums) for cluster, rollup in parts), combined)


def merged_epochs(parts: Iterable[tuple[str, StepRollup]]) -> dict[EpochKey, int]:
    """The earliest step of each (cluster, job, epoch) in several batches."""
    out: dict[EpochKey, int] = {}
    for cluster, rollup in parts:
        for (job, epoch), us in rollup.epochs.items():
            key = (cluster, job, epoch)
            seen = out.get(key)
            out[key] = us if seen is None else min(seen, us)
    return out


_KEY = ("cluster", "job_id", "rank", "ts")
_KEY_TYPES = ("text", "text", "int", "timestamptz")
_COLUMNS = ("steps", "duration_sum", "duration_max", "data_wait_sum", "samples_sum", "last_step", "epoch",
            "first_ts", "last_ts", "forward_sum", "forward_n")
_TYPES = ("int", "float8", "float8", "float8", "int8", "int8", "int", "timestamptz", "timestamptz", "float8", "int")
_ADDED = ("steps", "duration_sum")
_ADDED_OR_NULL = ("data_wait_sum", "samples_sum", "forward_sum", "forward_n")
_GREATEST = ("duration_max", "last_step", "epoch", "last_ts")  # greatest() passes over NULLs

# One JSON array for the rows, as rollup.py sends gpu_minutes (and for the same reason).
_UPSERT: Final = f"""
INSERT INTO step_minutes AS s ({", ".join(_KEY)}, {", ".join(_COLUMNS)})
SELECT {", ".join(_KEY)}, {", ".join(_COLUMNS)}
FROM jsonb_to_recordset(%s::jsonb) AS r(
    {", ".join(f"{c} {t}" for c, t in zip((*_KEY, *_COLUMNS), (*_KEY_TYPES, *_TYPES), strict=True))})
ON CONFLICT (job_id, cluster, ts, rank) DO UPDATE SET
    {", ".join(f"{c} = s.{c} + excluded.{c}" for c in _ADDED)},
    {", ".join(f"{c} = coalesce(s.{c} + excluded.{c}, s.{c}, excluded.{c})" for c in _ADDED_OR_NULL)},
    {", ".join(f"{c} = greatest(s.{c}, excluded.{c})" for c in _GREATEST)},
    first_ts = least(s.first_ts, excluded.first_ts)
"""


def _as_json(key: ClusterKey, s: StepSums) -> dict[str, Any]:
    cluster, job, rank, minute = key
    return {
        "cluster": cluster, "job_id": job, "rank": rank, "ts": ts_from_us(minute), "steps": s.steps,
        "duration_sum": s.duration_sum, "duration_max": s.duration_max, "data_wait_sum": s.data_wait_sum,
        "samples_sum": s.samples_sum, "last_step": s.last_step, "epoch": s.epoch,
        "first_ts": ts_from_us(s.first_ts), "last_ts": ts_from_us(s.last_ts), "forward_sum": s.forward_sum,
        "forward_n": s.forward_n,
    }


def upsert_minutes(conn: Connection, rows: dict[ClusterKey, StepSums]) -> None:
    """Add :func:`merged` rows to ``step_minutes``, in key order, in one statement."""
    if not rows:
        return
    conn.execute(_UPSERT, (orjson.dumps([_as_json(key, rows[key]) for key in sorted(rows)]).decode(),))


# Lowers a start only: a later group, or another process, may have written an earlier one.
_UPSERT_EPOCHS: Final = """
INSERT INTO epoch_starts AS e (cluster, job_id, epoch, ts)
SELECT * FROM unnest(%s::text[], %s::text[], %s::int4[], %s::timestamptz[])
ON CONFLICT (job_id, cluster, epoch) DO UPDATE SET ts = excluded.ts WHERE excluded.ts < e.ts
"""


def upsert_epoch_starts(conn: Connection, starts: dict[EpochKey, int]) -> None:
    """Write epoch starts (:meth:`EpochsSeen.due`), in key order, keeping the earliest."""
    if not starts:
        return
    keys = sorted(starts)
    conn.execute(
        _UPSERT_EPOCHS,
        ([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys], [ts_from_us(starts[k]) for k in keys]),
    )


MAX_EPOCHS: Final = 100_000
"""Epoch starts remembered; past this, the oldest half is forgotten (their next step writes them
again, a no-op but for the row lock)."""


class EpochsSeen:
    """The earliest start of each epoch this process has committed (shared by the group-commit
    writer threads). The row holds that time or an earlier one (another process's), so a group
    whose start is not earlier has nothing to write."""

    def __init__(self, limit: int = MAX_EPOCHS) -> None:
        self._starts: dict[EpochKey, int] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def due(self, starts: dict[EpochKey, int]) -> dict[EpochKey, int]:
        """Of a group's epoch starts, those earlier than what this process has written."""
        with self._lock:
            known = self._starts
            return {key: us for key, us in starts.items() if (seen := known.get(key)) is None or us < seen}

    def committed(self, written: dict[EpochKey, int]) -> None:
        """Record the starts a committed group wrote (only then: a rolled-back group wrote
        nothing the database keeps)."""
        with self._lock:
            known = self._starts
            for key, us in written.items():
                seen = known.get(key)
                known[key] = us if seen is None else min(seen, us)
            if len(known) > self._limit:
                # Insertion order: the epochs first seen longest ago, most of them of jobs that ended.
                for key in list(itertools.islice(known, len(known) - self._limit // 2)):
                    del known[key]


_MINUTE_OF_TS: Final = "date_bin(interval '1 minute', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00')"
_TRAIN: Final = "job_id = %(job)s AND cluster = %(cluster)s AND coalesce(phase, 'train') = 'train'"

_REBUILD_MINUTES: Final = f"""
INSERT INTO step_minutes (cluster, job_id, ts, rank, steps, duration_sum, duration_max, data_wait_sum,
                          samples_sum, last_step, epoch, first_ts, last_ts, forward_sum, forward_n)
SELECT %(cluster)s, %(job)s, {_MINUTE_OF_TS}, coalesce(rank, {NO_RANK}), count(*), sum(duration_s),
       max(duration_s), sum(data_wait_s), sum(samples), max(step), max(epoch), min(ts), max(ts),
       sum(forward_s), nullif(count(forward_s), 0)
FROM steps WHERE {_TRAIN}
GROUP BY {_MINUTE_OF_TS}, coalesce(rank, {NO_RANK})
"""

_REBUILD_EPOCHS: Final = f"""
INSERT INTO epoch_starts (cluster, job_id, epoch, ts)
SELECT %(cluster)s, %(job)s, epoch, min(ts) FROM steps WHERE {_TRAIN} AND epoch IS NOT NULL GROUP BY epoch
"""


def rebuild(conn: Connection, cluster: str, job_id: str) -> None:
    """Recompute a job's ``step_minutes`` and ``epoch_starts`` from its steps: for rows written
    around the ingest path (bulk loads, seeds, jobs stored before the rollup existed). The
    ``step_minutes`` partitions for the job's days must exist."""
    params = {"cluster": cluster, "job": job_id}
    conn.execute("DELETE FROM step_minutes WHERE job_id = %(job)s AND cluster = %(cluster)s", params)
    conn.execute("DELETE FROM epoch_starts WHERE job_id = %(job)s AND cluster = %(cluster)s", params)
    conn.execute(_REBUILD_MINUTES, params)
    conn.execute(_REBUILD_EPOCHS, params)
