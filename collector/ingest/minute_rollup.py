"""A batch's per-minute rollups, built and written here: the GPU minutes (and their hours) and the
training steps' minutes (and epoch starts).

Built when a batch is prepared, in the decode thread (:func:`add_rows`, from
:func:`~jobsight.collector.ingest.rows.prepare`): a kind's rows are folded into the batch's sums as
they are made. Written in the group's transaction (:func:`write`, from
:func:`~jobsight.collector.ingest.write.store_group`): the sums of every stored batch of the group
merged per key and upserted, GPU minutes, then GPU hours, then step minutes, then epoch starts, so
that concurrent groups lock their rows in one order. The sums themselves and their upserts are
the tiers' (:mod:`jobsight.collector.tiers.rollup`, :mod:`jobsight.collector.tiers.step_rollup`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import step_rollup
from jobsight.collector.tiers.rollup import MinuteRollup, hourly, merged, upsert_hours, upsert_minutes
from jobsight.collector.tiers.step_rollup import EpochKey, StepRollup

Rollups = tuple[str, MinuteRollup, StepRollup]
"""A stored batch's cluster, GPU minute sums and step minute sums."""


def add_rows(minutes: MinuteRollup, step_minutes: StepRollup, kind: str, rows: Sequence[tuple[Any, ...]],
             times: Sequence[int]) -> None:
    """Fold one kind's table rows (``times``: their ``ts`` in µs since the epoch) into a batch's
    sums: ``gpu_sample`` rows into the GPU minutes, ``step`` rows into the step minutes; other
    kinds have no rollup."""
    if kind == "gpu_sample":
        minutes.add_rows(rows, times)
    elif kind == "step":
        step_minutes.add_rows(rows, times)


def days(minutes: MinuteRollup, step_minutes: StepRollup) -> Mapping[str, set[dt.date]]:
    """The days of the rollup tables' rows a batch writes, by table, for its partitions
    (``gpu_minutes``' come with ``gpu_hours``')."""
    found: dict[str, set[dt.date]] = {}
    if minutes.sums:
        found["gpu_minutes"] = minutes.days()
    if step_minutes.sums:
        found["step_minutes"] = step_minutes.days()
    return found


def epoch_starts(stored: Iterable[Rollups]) -> dict[EpochKey, int]:
    """The epoch starts the stored batches' steps name, merged (the earliest for each epoch)."""
    return step_rollup.merged_epochs((cluster, steps) for cluster, _, steps in stored)


def write(conn: Connection, stored: Sequence[Rollups], epochs: dict[EpochKey, int]) -> None:
    """Add the stored batches' sums to the rollup tables, inside the caller's transaction (and
    pipeline), and write ``epochs`` (the epoch starts not written before)."""
    minutes = merged((cluster, gpu) for cluster, gpu, _ in stored)
    upsert_minutes(conn, minutes)
    upsert_hours(conn, hourly(minutes))
    step_rollup.upsert_minutes(conn, step_rollup.merged((cluster, steps) for cluster, _, steps in stored))
    step_rollup.upsert_epoch_starts(conn, epochs)
