"""Array tasks on the jobs list: each task is a job of its own (``1234_7``, the id Slurm users
see, from ``SLURM_ARRAY_JOB_ID``/``SLURM_ARRAY_TASK_ID``: agent/slurm/job.py), shown together
under its array."""

from __future__ import annotations

import re
from collections.abc import Sequence

_TASK = re.compile(r"^(\d+)_(\d+)$")


def array_of(job_id: str) -> str | None:
    """``1234_7`` → ``1234``; ``None`` for a job that is not an array task."""
    match = _TASK.match(job_id)
    return match.group(1) if match else None


def task_of(job_id: str) -> int | None:
    """``1234_7`` → 7; ``None`` for a job that is not an array task."""
    match = _TASK.match(job_id)
    return int(match.group(2)) if match else None


def grouped_order(job_ids: Sequence[str], clusters: Sequence[str] | None = None) -> list[int]:
    """Row positions with every array's tasks together, in task order, where the array's first
    row was; other jobs keep their places (the list's own order: running first, newest first)."""
    clusters = clusters if clusters is not None else [""] * len(job_ids)
    groups: dict[tuple[str, str], list[int]] = {}
    slots: list[tuple[str, str] | int] = []
    for position, (cluster, job) in enumerate(zip(clusters, job_ids, strict=True)):
        array = array_of(job)
        if array is None:
            slots.append(position)
            continue
        key = (cluster, array)
        if key not in groups:
            groups[key] = []
            slots.append(key)
        groups[key].append(position)
    order: list[int] = []
    for slot in slots:
        if isinstance(slot, int):
            order.append(slot)
        else:
            order.extend(sorted(groups[slot], key=lambda p: task_of(job_ids[p]) or 0))
    return order


def array_cells(job_ids: Sequence[str], clusters: Sequence[str] | None = None) -> list[str]:
    """The "array" column: ``1234 (3 tasks)`` on each task of an array (tasks counted on this
    page), ``""`` for other jobs."""
    clusters = clusters if clusters is not None else [""] * len(job_ids)
    counts: dict[tuple[str, str], int] = {}
    for cluster, job in zip(clusters, job_ids, strict=True):
        array = array_of(job)
        if array is not None:
            counts[(cluster, array)] = counts.get((cluster, array), 0) + 1
    cells = []
    for cluster, job in zip(clusters, job_ids, strict=True):
        array = array_of(job)
        if array is None:
            cells.append("")
        else:
            n = counts[(cluster, array)]
            cells.append(f"{array} ({n} task{'s' if n != 1 else ''})")
    return cells
