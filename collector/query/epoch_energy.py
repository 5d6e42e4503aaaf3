"""Energy per epoch of a job, from the energy counters of the GPUs its ranks use.

The GPUs are those whose samples are attributed to the job, as in its summary
(:mod:`jobsight.collector.jobs.summaries`), which also decides each GPU's method the same way: its
NVML energy counter when two or more of its samples carry one, else the trapezoidal integral of
its power over time (pre-Volta GPUs have no counter). Either gives a cumulative energy per GPU,
known at some times; an epoch's energy is, summed over the GPUs, that cumulative energy at the
epoch's end minus at its start. The epochs (:mod:`jobsight.collector.query.epoch_steps`) tile the
training run, so with the time before the first epoch (start-up) and after the last step they
tile the sampled run: every GPU's values telescope to last minus first, which is its energy in
the summary, and the rows add up to the job's energy.

A boundary rarely falls on a sample. The cumulative energy there is interpolated linearly
between the two readings around it: between them the GPU used their difference at a rate no
reading tells, so spreading it evenly over the time is the best guess. Taking the nearest
reading instead would move up to half a sampling interval's energy across the boundary (a
700 W GPU sampled every 5 s: 1.75 kJ per boundary). Either way one GPU's value at one time is
one number, so the epochs still add up exactly.

What is read, for a 64-GPU, 24-hour job (5.5 M samples):

* counters: the hourly rollup's first and last reading of each GPU-hour (1,536 rows), plus,
  near each boundary only, the last reading before it and the first after it among those within
  :data:`NEAR`: the samples near any boundary are read once, and each GPU's are searched per
  boundary (bisection), so the cost is samples plus boundaries × GPUs, never their product. Where a
  GPU has none there (sampling slower than that, or a gap), the per-minute rollup's first and last
  readings of the minutes around that boundary are read too, and failing those the hours' are the
  nearest;
* power integrals: every sample of the GPUs without a counter, as the summary integrates them,
  reduced in SQL to the first and last of each stretch between boundaries.

A job says how many epochs it has (its step records), so one read lists at most ``max_epochs``
(:data:`MAX_EPOCHS` unless the caller says): the latest ones, and reads only their rows
(:func:`~jobsight.collector.query.epoch_steps.latest_epochs`). The earlier ones are one span
(``epochs_left_out``, with their count; their steps are not counted), so the spans still add up to
the job's energy.
"""

from __future__ import annotations

import datetime as dt
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Final

from jobsight.collector.jobs.node_energy import J_PER_KWH
from jobsight.collector.query import epoch_steps
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import host_tier
from jobsight.collector.tiers import reads as tiers

COUNTER: Final = "counter"
POWER_INTEGRAL: Final = "power integral"
BOTH: Final = "counter + power integral"
"""How a figure was obtained: from the GPUs' energy counters, by integrating power over time for
GPUs without one, or the two (some GPUs each way)."""

NEAR: Final = dt.timedelta(seconds=10)
"""How far from a boundary raw samples are looked for: two intervals of the agent's default 5 s."""

MAX_EPOCHS: Final = 1000
"""Epochs one read lists at most (the collector's ``max_epochs_per_read`` by default)."""

GpuKey = tuple[str, int, str]
"""node, GPU index, MIG device ('' for none)."""
Point = tuple[dt.datetime, float]


def _key(row: dict[str, Any]) -> GpuKey:
    return (row["node"] or "", row["gpu_index"], row["mig_uuid"] or "")


@dataclass
class GpuCurve:
    """One GPU's cumulative energy in joules at known times (counter readings, or the running
    power integral at samples)."""

    method: str
    points: list[Point] = field(default_factory=list)
    _times: list[dt.datetime] = field(default_factory=list, repr=False)

    def sort(self) -> None:
        """Order the points by time; :meth:`at` reads them only after this."""
        self.points.sort()
        self._times = [t for t, _ in self.points]

    def at(self, when: dt.datetime) -> float:
        """The value at ``when``, interpolated between the points around it; before the first
        point, the first (nothing used yet), after the last, the last."""
        i = bisect_right(self._times, when)
        if i == 0:
            return self.points[0][1]
        if i == len(self.points):
            return self.points[-1][1]
        (t0, v0), (t1, v1) = self.points[i - 1], self.points[i]
        return v0 + (v1 - v0) * ((when - t0) / (t1 - t0))


_HOURS: Final = """
SELECT node, gpu_index, mig_uuid, first_ts, last_ts, energy_min, energy_max, energy_n
FROM gpu_hours WHERE job_id = %(job)s AND cluster = %(cluster)s
"""

# The counter readings of the samples within %(near)s of any boundary, read once for all of them.
_NEAR_SAMPLES: Final = f"""
SELECT node, gpu_index, mig_uuid, ts, energy_j AS value
FROM {tiers.samples_near(("energy_j",), times="%(bounds)s::timestamptz[]", near="%(near)s")} g
WHERE energy_j IS NOT NULL
"""

# The readings the per-minute rollup keeps of the minutes around each boundary. A monotonic
# counter's least reading of a period is its first and its greatest its last, so a rollup row
# gives two: (first_ts, energy_min) and (last_ts, energy_max).
_NEAR_MINUTES: Final = f"""
WITH bd(at) AS (SELECT unnest(%(bounds)s::timestamptz[]))
SELECT m.node, m.gpu_index, m.mig_uuid, e.ts, e.value
FROM bd CROSS JOIN LATERAL {tiers.minutes(("first_ts", "last_ts", "energy_min", "energy_max"),
                                          start="bd.at - interval '2 minutes'", end="bd.at + interval '1 minute'")} m
CROSS JOIN LATERAL (VALUES (m.first_ts, m.energy_min), (m.last_ts, m.energy_max)) e(ts, value)
WHERE m.energy_min IS NOT NULL
"""

# Per GPU and stretch between boundaries (width_bucket's part): the first and last sample, with
# the running power integral (as summaries._POWER_SQL integrates, in the same order) and the
# counter readings. Both only grow, so their least and greatest are at the first and last sample.
_SAMPLES_BY_PART: Final = f"""
WITH s AS (
    SELECT node, gpu_index, mig_uuid, ts, power_w, energy_j,
           extract(epoch FROM ts - lag(ts) OVER w) AS dt_s, lag(power_w) OVER w AS prev_power_w
    FROM {tiers.samples(("power_w", "energy_j"))} g
    WHERE %(every_gpu)s OR gpu_index = ANY(%(gpus)s)
    WINDOW w AS (PARTITION BY node, gpu_index, mig_uuid ORDER BY ts, power_w)
), c AS (
    SELECT node, gpu_index, mig_uuid, ts, power_w, energy_j, width_bucket(ts, %(bounds)s::timestamptz[]) AS part,
           coalesce(sum(dt_s * (power_w + prev_power_w) / 2) OVER (
               PARTITION BY node, gpu_index, mig_uuid ORDER BY ts, power_w ROWS UNBOUNDED PRECEDING), 0) AS power_j
    FROM s
)
SELECT node, gpu_index, mig_uuid, part, min(ts) AS first_ts, max(ts) AS last_ts,
       min(power_j) AS power_first, max(power_j) AS power_last, count(power_w) AS power_n,
       count(energy_j) AS energy_n, min(energy_j) AS energy_min, max(energy_j) AS energy_max,
       min(ts) FILTER (WHERE energy_j IS NOT NULL) AS energy_first_ts,
       max(ts) FILTER (WHERE energy_j IS NOT NULL) AS energy_last_ts
FROM c GROUP BY node, gpu_index, mig_uuid, part
"""


def _from_samples(conn: Connection, params: dict[str, Any], bounds: list[dt.datetime],
                  only: set[GpuKey] | None) -> dict[GpuKey, GpuCurve]:
    """Curves from the samples: the power integral of the GPUs in ``only``; with ``None``, of
    every GPU, by counter where it has one (a job stored without rollups)."""
    rows = conn.execute(_SAMPLES_BY_PART, {
        **params, "every_gpu": only is None, "gpus": sorted({k[1] for k in only or ()}),
        # width_bucket needs one bound at least; with none, every sample is in one part.
        "bounds": bounds or [dt.datetime.min.replace(tzinfo=dt.UTC)],
    }).fetchall()
    by_gpu: dict[GpuKey, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if only is None or _key(row) in only:
            by_gpu[_key(row)].append(row)
    curves = {}
    for key, parts in by_gpu.items():
        if only is None and sum(p["energy_n"] for p in parts) >= 2:
            curves[key] = GpuCurve(COUNTER, [pt for p in parts if p["energy_n"] for pt in (
                (p["energy_first_ts"], p["energy_min"]), (p["energy_last_ts"], p["energy_max"]))])
        elif sum(p["power_n"] for p in parts) >= 2:
            curves[key] = GpuCurve(POWER_INTEGRAL, [pt for p in parts for pt in (
                (p["first_ts"], p["power_first"]), (p["last_ts"], p["power_last"]))])
    return curves


def _next_to(readings: list[Point], times: list[dt.datetime], at: dt.datetime) -> tuple[Point | None, Point | None]:
    """Of one GPU's ``readings`` (ascending, ``times`` theirs), the last at or before ``at`` and the
    first after it, each only when within :data:`NEAR` of it."""
    i = bisect_right(times, at)
    before = readings[i - 1] if i > 0 and times[i - 1] >= at - NEAR else None
    after = readings[i] if i < len(times) and times[i] <= at + NEAR else None
    return before, after


def _add_near_readings(conn: Connection, params: dict[str, Any], bounds: list[dt.datetime],
                       curves: dict[GpuKey, GpuCurve]) -> None:
    """Add to the counter ``curves`` the readings around each of ``bounds``: the samples next to
    it, and where a GPU has none within :data:`NEAR` on a side while the boundary is inside its
    readings (sampling slower than that, or a gap), the readings of the minutes around it."""
    near: dict[GpuKey, list[Point]] = defaultdict(list)
    for row in conn.execute(_NEAR_SAMPLES, {**params, "bounds": bounds, "near": NEAR}).fetchall():
        if (key := _key(row)) in curves:
            near[key].append((row["ts"], row["value"]))
    found: set[tuple[int, GpuKey, bool]] = set()
    for key, readings in near.items():
        readings.sort()
        times = [t for t, _ in readings]
        for index, at in enumerate(bounds):
            for after, reading in enumerate(_next_to(readings, times, at)):
                if reading is not None:
                    curves[key].points.append(reading)
                    found.add((index, key, bool(after)))
    spans = {key: (min(t for t, _ in c.points), max(t for t, _ in c.points)) for key, c in curves.items() if c.points}
    lacking = [b for i, b in enumerate(bounds) for key, (first, last) in spans.items()
               if first < b < last and not {(i, key, False), (i, key, True)} <= found]
    if lacking:
        for row in conn.execute(_NEAR_MINUTES, {**params, "bounds": sorted(set(lacking))}).fetchall():
            if (curve := curves.get(_key(row))) is not None:
                curve.points.append((row["ts"], row["value"]))


def gpu_curves(conn: Connection, cluster: str, job_id: str, bounds: list[dt.datetime]) -> dict[GpuKey, GpuCurve]:
    """Each GPU's cumulative energy, with points enough to read it at ``bounds`` (ascending)."""
    params: dict[str, Any] = {"job": job_id, "cluster": cluster}
    hours = conn.execute(_HOURS, params).fetchall()
    if not hours:
        curves = _from_samples(conn, params, bounds, None)
    else:
        readings: dict[GpuKey, int] = defaultdict(int)
        for h in hours:
            readings[_key(h)] += h["energy_n"]
        curves = {key: GpuCurve(COUNTER) for key, n in readings.items() if n >= 2}
        for h in hours:
            if (curve := curves.get(_key(h))) is not None and h["energy_min"] is not None:
                curve.points += [(h["first_ts"], h["energy_min"]), (h["last_ts"], h["energy_max"])]
        if bounds and curves:
            _add_near_readings(conn, params, bounds, curves)
        if without := set(readings) - set(curves):
            curves.update(_from_samples(conn, params, bounds, without))
    for curve in curves.values():
        curve.sort()
    return {key: curve for key, curve in curves.items() if curve.points}


# The job's share of its nodes' energy per stretch between boundaries: a host sample's joules are
# those of the interval that ends at its time, counted in the stretch that time falls in.
_NODE_BY_PART: Final = f"""
SELECT width_bucket(ts, %(bounds)s::timestamptz[]) AS part, sum(energy_j) AS energy_j
FROM {host_tier.samples()} h WHERE energy_j IS NOT NULL GROUP BY 1
"""


def node_energy_by_part(conn: Connection, cluster: str, job_id: str, bounds: list[dt.datetime]) -> dict[int, float]:
    """Joules of the nodes' energy beside the GPUs per part (0: before ``bounds[0]``)."""
    rows = conn.execute(_NODE_BY_PART, {"cluster": cluster, "job": job_id,
                                        "bounds": bounds or [dt.datetime.min.replace(tzinfo=dt.UTC)]}).fetchall()
    return {row["part"]: float(row["energy_j"]) for row in rows} if bounds else \
        {0: sum(float(row["energy_j"]) for row in rows)}


def _method(methods: set[str]) -> str | None:
    return None if not methods else BOTH if len(methods) > 1 else next(iter(methods))


def _span(epoch: int | None, start: dt.datetime, end: dt.datetime, energy_j: float | None, method: str | None,
          *, steps: int | None = None, samples: int | None = None, growing: bool = False,
          node_j: float | None = None) -> dict[str, Any]:
    seconds = (end - start).total_seconds()
    parts = [e for e in (energy_j, node_j) if e is not None]
    total = sum(parts) if parts else None
    return {
        "node_energy_j": node_j, "total_energy_j": total,
        "total_kwh": total / J_PER_KWH if total is not None else None,
        "epoch": epoch, "start": start, "end": end, "duration_s": seconds, "steps": steps, "samples": samples,
        "samples_per_s": samples / seconds if samples is not None and seconds > 0 else None,
        "energy_j": energy_j, "energy_kwh": energy_j / J_PER_KWH if energy_j is not None else None,
        "j_per_sample": energy_j / samples if energy_j is not None and samples else None,
        "mean_power_w": energy_j / seconds if energy_j is not None and seconds > 0 else None,
        "method": method, "growing": growing,
    }


def job_epochs(conn: Connection, cluster: str, job_id: str, *, running: bool,
               max_epochs: int = MAX_EPOCHS) -> dict[str, Any]:
    """Per epoch of the job: start, end, duration, steps, samples, samples/s, energy (J and kWh),
    J per sample, mean power, and the method (:data:`COUNTER`, :data:`POWER_INTEGRAL` or
    :data:`BOTH`); the energy before the first epoch and after the last step; the job's energy.
    While the job runs (``running``), the last epoch, the time after it and the total are still
    growing (``growing``). Energies are ``None`` when no GPU of the job has a counter or power. Beside the
    GPUs' (``energy_j``), each span has the job's share of its nodes' energy (``node_energy_j``, ``None``
    without a node power source) and both (``total_energy_j``, ``total_kwh``).

    At most ``max_epochs`` epochs are listed, the latest; ``epochs_left_out`` is then the earlier ones as
    one span (``epochs``: how many; ``None`` when none was left out), and ``epoch_count`` is every epoch."""
    latest = epoch_steps.latest_epochs(conn, cluster, job_id, max_epochs)
    epochs, left_out_start = latest.epochs, latest.left_out_start
    # Bounds: the left-out epochs' start (when there are any), each listed epoch's start, the last one's end.
    bounds = [*([left_out_start] if left_out_start else []), *(e.start for e in epochs), epochs[-1].end] \
        if epochs else []
    first_epoch = 1 if left_out_start else 0  # the part of bounds where the listed epochs begin, less one
    curves = gpu_curves(conn, cluster, job_id, bounds)
    values = [[c.points[0][1], *(c.at(b) for b in bounds), c.points[-1][1]] for c in curves.values()]
    method = _method({c.method for c in curves.values()})

    def energy(part: int) -> float | None:
        """Part 0 is before the first bound, part ``len(bounds)`` after the last."""
        return sum(v[part + 1] - v[part] for v in values) if values else None

    total = sum(v[-1] - v[0] for v in values) if values else None
    node = node_energy_by_part(conn, cluster, job_id, bounds)
    spans = [_span(e.epoch, e.start, e.end, energy(first_epoch + i + 1), method, steps=e.steps, samples=e.samples,
                   growing=running and i == len(epochs) - 1, node_j=node.get(first_epoch + i + 1))
             for i, e in enumerate(epochs)]
    before = after = earlier = None
    if left_out_start is not None and epochs:
        # Their steps and samples are not counted: that would read every one of their rows.
        earlier = {**_span(None, left_out_start, epochs[0].start, energy(1), method, node_j=node.get(1)),
                   "epochs": latest.left_out}
    if epochs and curves:
        first = min(c.points[0][0] for c in curves.values())
        last = max(c.points[-1][0] for c in curves.values())
        before = _span(None, min(first, bounds[0]), bounds[0], energy(0), method, node_j=node.get(0))
        after = _span(None, epochs[-1].end, max(last, epochs[-1].end), energy(len(bounds)), method, growing=running,
                      node_j=node.get(len(bounds)))
    node_total = sum(node.values()) if node else None
    return {
        "cluster": cluster, "job_id": job_id, "running": running,
        "energy_j": total, "energy_kwh": total / J_PER_KWH if total is not None else None, "method": method,
        "node_energy_j": node_total,
        "gpus": {m: sum(1 for c in curves.values() if c.method == m) for m in (COUNTER, POWER_INTEGRAL)},
        "epoch_count": len(epochs) + latest.left_out, "epochs": spans, "epochs_left_out": earlier,
        "before_first_epoch": before, "after_last_step": after,
    }
