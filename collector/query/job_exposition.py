"""What the jobs' Prometheus exposition shows, read in one transaction of a few bounded statements.

Only *running* jobs are read (``jobs.state``, indexed): an ended job has no rows here, so its series
leave the next scrape and Prometheus marks them stale. Each statement starts from the running jobs
and reads, per job, through that table's job index and only the newest rows:

* each GPU's latest sample of the hot tier (``gpu_samples``) within ``since``: about ``window /
  sampling interval`` rows per GPU, never the job's history;
* each rank's latest step minute (``step_minutes``, the ingest-time rollup) within ``since``;
* the open findings, counted by rule and severity;
* energy so far (:func:`read_energy`, the costlier read, which the route caches): the GPUs' from the
  hourly rollup as the audit reads it (:mod:`jobsight.collector.query.energy_so_far`), the nodes'
  share from the host tier.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

from jobsight.collector.jobs.node_energy import J_PER_KWH
from jobsight.collector.query.energy_so_far import energy_kwh_sql
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import host_tier

JobKey = tuple[str, str]
"""``(cluster, job_id)``."""


@dataclass(frozen=True)
class RunningJob:
    cluster: str
    job_id: str
    user: str
    account: str
    partition: str
    name: str
    """Empty strings where the job did not say (a label without a value is the same as none)."""


@dataclass(frozen=True)
class GpuLatest:
    """One GPU's latest sample; a field ``None`` where NVML could not tell."""

    key: JobKey
    node: str
    gpu: str
    """The GPU's index, with ``/<MIG uuid>`` for a MIG instance."""
    util_ratio: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_watts: float | None
    sm_clock_hertz: float | None
    throttle_mask: int | None


@dataclass(frozen=True)
class RankLatest:
    """One rank's latest minute of training steps (rank -1: steps sent without a rank)."""

    key: JobKey
    rank: int
    step_seconds: float
    data_wait_ratio: float | None
    """``None`` where no step said how long it waited for data."""
    last_step: int


@dataclass(frozen=True)
class OpenFindings:
    key: JobKey
    rule: str
    severity: str
    count: int


@dataclass(frozen=True)
class JobEnergy:
    """Joules so far; ``None`` where no sample carried a figure."""

    gpu_joules: float | None
    node_joules: float | None


@dataclass(frozen=True)
class JobsNow:
    jobs: list[RunningJob]
    gpus: list[GpuLatest]
    ranks: list[RankLatest]
    findings: list[OpenFindings]


_RUNNING: Final = """
SELECT cluster, job_id, coalesce(user_name, '') AS user_name, coalesce(account, '') AS account,
       coalesce(partition, '') AS partition, coalesce(name, '') AS name
FROM jobs WHERE state = 'running'
ORDER BY start_time NULLS LAST, cluster, job_id
"""

# Per running job, its newest GPU rows through the (job_id, ts) index of each day partition that
# ``since`` leaves in; DISTINCT ON keeps each GPU's latest.
GPUS_LATEST: Final = """
SELECT j.cluster, j.job_id, s.node, s.gpu_index, s.mig_uuid, s.util_gpu, s.mem_used, s.mem_total, s.power_w,
       s.sm_clock_mhz, s.throttle_reasons
FROM jobs j
CROSS JOIN LATERAL (
    SELECT DISTINCT ON (node, gpu_index, mig_uuid) coalesce(node, '') AS node, gpu_index, mig_uuid, util_gpu,
           mem_used, mem_total, power_w, sm_clock_mhz, throttle_reasons
    FROM gpu_samples
    WHERE job_id = j.job_id AND cluster = j.cluster AND ts > %(since)s AND NOT coalesce(lost, false)
    ORDER BY node, gpu_index, mig_uuid, ts DESC
) s
WHERE j.state = 'running'
"""

_RANKS: Final = """
SELECT j.cluster, j.job_id, m.rank, m.duration_sum / nullif(m.steps, 0) AS step_s,
       m.data_wait_sum / nullif(m.duration_sum, 0) AS wait_ratio, m.last_step
FROM jobs j
CROSS JOIN LATERAL (
    SELECT DISTINCT ON (rank) rank, steps, duration_sum, data_wait_sum, last_step
    FROM step_minutes
    WHERE job_id = j.job_id AND cluster = j.cluster AND ts >= date_trunc('minute', %(since)s::timestamptz)
    ORDER BY rank, ts DESC
) m
WHERE j.state = 'running' AND m.steps > 0
"""

_FINDINGS: Final = """
SELECT f.cluster, f.job_id, f.rule, f.severity, count(*) AS n
FROM findings f JOIN jobs j ON j.cluster = f.cluster AND j.job_id = f.job_id
WHERE f.state = 'open' AND j.state = 'running'
GROUP BY f.cluster, f.job_id, f.rule, f.severity
"""

_ENERGY: Final = f"""
SELECT j.cluster, j.job_id, g.energy_kwh * {J_PER_KWH} AS gpu_j, n.energy_j AS node_j
FROM jobs j
CROSS JOIN LATERAL {energy_kwh_sql("j.job_id", "j.cluster")} g
CROSS JOIN LATERAL (
    SELECT sum(energy_j) AS energy_j FROM {host_tier.samples(job="j.job_id", cluster="j.cluster")} h
) n
WHERE j.state = 'running'
"""


def _opt(value: Any, kind: type[float] | type[int]) -> Any:
    return None if value is None else kind(value)


def _gpu(row: dict[str, Any]) -> GpuLatest:
    gpu = str(row["gpu_index"]) + (f"/{row['mig_uuid']}" if row["mig_uuid"] else "")
    util = row["util_gpu"]
    clock = row["sm_clock_mhz"]
    return GpuLatest(
        key=(row["cluster"], row["job_id"]), node=row["node"], gpu=gpu,
        util_ratio=None if util is None else float(util) / 100.0,
        mem_used_bytes=_opt(row["mem_used"], int), mem_total_bytes=_opt(row["mem_total"], int),
        power_watts=_opt(row["power_w"], float), sm_clock_hertz=None if clock is None else float(clock) * 1e6,
        throttle_mask=_opt(row["throttle_reasons"], int),
    )


def read_jobs_now(conn: Connection, now: dt.datetime, window_s: float) -> JobsNow:
    """The running jobs (oldest first), their GPUs' and ranks' latest values no older than ``window_s``
    before ``now``, and their open findings. ``conn`` gives rows as dicts (the pools' connections do)."""
    params = {"since": now - dt.timedelta(seconds=window_s)}
    jobs = [RunningJob(r["cluster"], r["job_id"], r["user_name"], r["account"], r["partition"], r["name"])
            for r in conn.execute(_RUNNING).fetchall()]
    gpus = [_gpu(r) for r in conn.execute(GPUS_LATEST, params).fetchall()]
    ranks = [RankLatest((r["cluster"], r["job_id"]), int(r["rank"]), float(r["step_s"]),
                        _opt(r["wait_ratio"], float), int(r["last_step"]))
             for r in conn.execute(_RANKS, params).fetchall() if r["step_s"] is not None]
    findings = [OpenFindings((r["cluster"], r["job_id"]), r["rule"], r["severity"], int(r["n"]))
                for r in conn.execute(_FINDINGS).fetchall()]
    return JobsNow(jobs, gpus, ranks, findings)


def read_energy(conn: Connection) -> dict[JobKey, JobEnergy]:
    """Every running job's energy so far: its GPUs' (the hourly rollup) and its share of its nodes'
    (the host tier). Reads each job's host samples whole: the route caches it
    (``exposition.energy_refresh_s``)."""
    return {(r["cluster"], r["job_id"]): JobEnergy(_opt(r["gpu_j"], float), _opt(r["node_j"], float))
            for r in conn.execute(_ENERGY).fetchall()}
