"""A job's whole energy (its GPUs' and its share of its nodes') and its emissions.

The figures:

* GPU energy: as it always was (the summary's at the job's end, the hourly rollup's so far while it
  runs: :mod:`jobsight.collector.query.energy_so_far`);
* node energy: the job's share of its nodes' power beside the GPUs, as the node daemons split it
  (:mod:`jobsight.collector.jobs.node_energy`), with the sources and the split named;
* emissions: kg CO2e = kWh × PUE × carbon intensity, hour by hour. Each UTC hour of the job weighs
  the intensity of that hour (:mod:`jobsight.collector.query.carbon_intensity`) by the energy the
  job used in it: the nodes' hour by hour as stored, the GPUs' by the hourly rollup's readings
  (counters' rise, or mean power times the time sampled), scaled so that the hours add up to the
  GPU figure above. With one intensity for every hour (a site value, a yearly figure) that is
  simply kWh × PUE × intensity.

An ended job's emissions are computed once by the emissions pass (``collector/passes/emissions.py``)
and kept in its summary with the factors they were computed with, so a later change of the site's
factors does not rewrite history; :func:`job_energy` reads them from there, and computes them the
same way while the job runs or before the pass came by.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import defaultdict
from typing import Any, Final

from jobsight.collector.config.carbon import CarbonSettings
from jobsight.collector.jobs.node_energy import J_PER_KWH, node_energy
from jobsight.collector.jobs.summaries import get_summary
from jobsight.collector.query.carbon_intensity import CarbonIntensity, emissions_kg
from jobsight.collector.query.energy_so_far import energy_so_far_kwh
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import host_tier

_UTC_HOUR: Final = "date_bin('1 hour', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00')"

# Per GPU and hour: what it used in the hour. A counter's rise from the previous hour's last reading
# (the first hour: from its own first), else mean power over the time sampled in the hour.
_GPU_HOURS: Final = """
SELECT ts AS hour, sum(CASE WHEN energy_n > 0 AND gpu_counted
                            THEN energy_max - coalesce(prev_max, energy_min)
                            ELSE coalesce(power_sum / nullif(power_n, 0), 0)
                                 * extract(epoch FROM last_ts - first_ts) END) AS energy_j
FROM (SELECT ts, energy_n, energy_min, energy_max, power_sum, power_n, first_ts, last_ts,
             sum(energy_n) OVER (PARTITION BY node, gpu_index, mig_uuid) >= 2 AS gpu_counted,
             lag(energy_max) OVER (PARTITION BY node, gpu_index, mig_uuid ORDER BY ts) AS prev_max
      FROM gpu_hours WHERE job_id = %(job)s AND cluster = %(cluster)s
        AND (%(start)s::timestamptz IS NULL OR ts >= date_bin('1 hour', %(start)s::timestamptz,
                                                               TIMESTAMPTZ '2000-01-01 00:00:00+00'))) h
GROUP BY ts
"""

_NODE_HOURS: Final = f"""
SELECT {_UTC_HOUR} AS hour, sum(energy_j) AS energy_j
FROM {host_tier.samples(start="%(start)s")} h WHERE energy_j IS NOT NULL GROUP BY 1
"""
_NODE_HOURS_ALL: Final = f"""
SELECT {_UTC_HOUR} AS hour, sum(energy_j) AS energy_j
FROM {host_tier.samples()} h WHERE energy_j IS NOT NULL GROUP BY 1
"""


_CARBON: dict[str, CarbonIntensity] = {}
_CARBON_LOCK: Final = threading.Lock()


def carbon_of(settings: CarbonSettings) -> CarbonIntensity:
    """The one :class:`CarbonIntensity` of these settings in this process: its series cache is shared
    by the API, the dashboard's pages and the emissions pass."""
    key = settings.model_dump_json()
    with _CARBON_LOCK:
        if (found := _CARBON.get(key)) is None:
            found = _CARBON[key] = CarbonIntensity(settings)
        return found


def hourly_kwh(conn: Connection, cluster: str, job_id: str, gpu_kwh: float | None,
               since: dt.datetime | None = None) -> dict[dt.datetime, float]:
    """The job's kWh per UTC hour (GPUs and nodes), the GPUs' hours scaled to ``gpu_kwh``."""
    params = {"cluster": cluster, "job": job_id, "start": since}
    gpu = {r["hour"]: max(float(r["energy_j"] or 0), 0.0) for r in conn.execute(_GPU_HOURS, params).fetchall()}
    node = {r["hour"]: float(r["energy_j"]) for r in conn.execute(
        _NODE_HOURS_ALL if since is None else _NODE_HOURS, params).fetchall()}
    hours: dict[dt.datetime, float] = defaultdict(float)
    weight = sum(gpu.values())
    if gpu_kwh:
        if weight > 0:
            for hour, joules in gpu.items():
                hours[hour] += gpu_kwh * joules / weight
        else:  # no hourly rollup (a job stored without one): its GPUs' energy in its last hour
            hours[max(node, default=dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0))] += gpu_kwh
    for hour, joules in node.items():
        hours[hour] += joules / J_PER_KWH
    return dict(hours)


def emissions(carbon: CarbonIntensity, by_hour: dict[dt.datetime, float]) -> dict[str, Any] | None:
    """kg CO2e of ``by_hour``'s kWh with the site's factors, and the factors: PUE, the energy-weighted
    intensity, its sources; ``None`` when the site configured no intensity."""
    if not carbon.configured() or not by_hour:
        return None
    hours = sorted(by_hour)
    intensities = carbon.for_hours(hours)
    if not intensities:
        return None
    pue = carbon.settings.pue
    kwh = sum(by_hour.values())
    kg = sum(emissions_kg(by_hour[h], i.g_per_kwh, pue) for h, i in zip(hours, intensities, strict=True))
    weighted = sum(by_hour[h] * i.g_per_kwh for h, i in zip(hours, intensities, strict=True))
    return {
        "co2e_kg": kg,
        "pue": pue,
        "intensity_g_per_kwh": weighted / kwh if kwh > 0 else intensities[0].g_per_kwh,
        "intensity_sources": sorted({i.source for i in intensities}),
        "computed_at": dt.datetime.now(dt.UTC).isoformat(),
    }


def _run_start(summary: dict[str, Any] | None) -> dt.datetime | None:
    if summary is None or not summary.get("run"):
        return None
    start = summary.get("start")
    return dt.datetime.fromisoformat(start) if isinstance(start, str) else None


def job_energy(conn: Connection, cluster: str, job_id: str, carbon: CarbonIntensity,
               summary_row: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's energy and emissions, for the job page, the report and the API: ``gpu_kwh``,
    ``node_kwh``, ``total_kwh`` (``None`` where unknown), ``node`` (sources, split, samples measured),
    ``emissions`` (see :func:`emissions`, ``None`` without a configured intensity) and ``final``: the
    job has ended and its figures are its summary's (else they are so far, still growing)."""
    summary = summary_row["summary"] if summary_row is not None else None
    if summary is not None:
        gpu_kwh = summary.get("energy_kwh")
        node = summary.get("node_energy") or node_energy(conn, cluster, job_id, _run_start(summary))
        stored = summary.get("emissions")
    else:
        gpu_kwh = energy_so_far_kwh(conn, cluster, job_id)
        node = node_energy(conn, cluster, job_id)
        stored = None
    node_kwh = node.get("energy_kwh")
    parts = [e for e in (gpu_kwh, node_kwh) if e is not None]
    if stored is None:
        stored = emissions(carbon, hourly_kwh(conn, cluster, job_id, gpu_kwh, _run_start(summary)))
    return {
        "gpu_kwh": gpu_kwh, "node_kwh": node_kwh, "total_kwh": sum(parts) if parts else None,
        "node": node, "emissions": stored, "final": summary is not None,
        "carbon": carbon.describe(),
    }


def read_job_energy(conn: Connection, cluster: str, job_id: str, carbon: CarbonIntensity) -> dict[str, Any]:
    """:func:`job_energy` of the job, its summary read here (the dashboard's way in)."""
    return job_energy(conn, cluster, job_id, carbon, get_summary(conn, cluster, job_id))


def co2e_per_kwh(carbon: CarbonIntensity) -> float | None:
    """kg CO2e per kWh at the site's one figure (its value or the yearly mean) with its PUE: what the
    audit counts a running job's energy so far at; ``None`` where none is configured."""
    yearly = carbon.yearly()
    return None if yearly is None else emissions_kg(1.0, yearly.g_per_kwh, carbon.settings.pue)
