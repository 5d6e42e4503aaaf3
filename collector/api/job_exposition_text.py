"""The jobs' exposition as Prometheus text (format 0.0.4), with its cap on series.

Names and units follow Prometheus' conventions (base units: ``_bytes``, ``_watts``, ``_hertz``,
``_seconds``, ``_ratio`` for 0-1 shares, ``_joules_total`` and ``_grams_total`` for what only grows);
``promtool check metrics`` passes on it (tests/prometheus/test_job_exposition.py). Every series of a
job carries ``cluster, job, user, account, partition``; a GPU's adds ``node, gpu``, a rank's ``rank``,
an open finding's ``rule, severity``, an active throttle reason's ``reason``.

Label values are what jobs and users sent (a job's name, a user name): they are data, written with
the format's three escapes (backslash, double quote, line feed), so no value can end its label, add a
label or start a line.

Cardinality: a running job is about ``GPUs x 6 + ranks x 3 + findings + 4`` series, an ended job
none. The cap (``exposition.max_series``) takes whole jobs, oldest first, and counts what it left
out (``jobsight_exposition_series_left_out_total``, ``jobsight_exposition_jobs_left_out``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from jobsight.collector.query.job_exposition import (
    GpuLatest,
    JobEnergy,
    JobKey,
    JobsNow,
    OpenFindings,
    RankLatest,
    RunningJob,
)
from jobsight.protocol.throttle import names as throttle_names

JOB_LABELS: Final = ("cluster", "job", "user", "account", "partition")


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    help: str


FAMILIES: Final[tuple[Family, ...]] = (
    Family("jobsight_job_info", "gauge", "A running job (1), with its name"),
    Family("jobsight_job_gpu_utilization_ratio", "gauge", "GPU utilisation (0-1) at the GPU's latest sample"),
    Family("jobsight_job_gpu_memory_used_bytes", "gauge", "GPU memory used at the GPU's latest sample"),
    Family("jobsight_job_gpu_memory_total_bytes", "gauge", "GPU memory of the GPU"),
    Family("jobsight_job_gpu_power_watts", "gauge", "GPU power draw at the GPU's latest sample"),
    Family("jobsight_job_gpu_sm_clock_hertz", "gauge", "GPU SM clock at the GPU's latest sample"),
    Family("jobsight_job_gpu_throttle_reason", "gauge",
           "A clock event (throttle) reason active at the GPU's latest sample (1; absent when not active)"),
    Family("jobsight_job_step_duration_seconds", "gauge", "Mean training step time of the rank's latest minute"),
    Family("jobsight_job_step_data_wait_ratio", "gauge",
           "Share (0-1) of the rank's step time in its latest minute spent waiting for data"),
    Family("jobsight_job_last_step", "gauge", "The latest training step the rank reported"),
    Family("jobsight_job_open_findings", "gauge", "Open health findings of the job, by rule and severity"),
    Family("jobsight_job_gpu_energy_joules_total", "counter", "Energy the job's GPUs used so far"),
    Family("jobsight_job_node_energy_joules_total", "counter",
           "The job's share of its nodes' energy beside the GPUs so far"),
    Family("jobsight_job_emissions_grams_total", "counter",
           "CO2e of the job's energy so far at the site's carbon intensity and PUE"),
)
_INDEX: Final = {family.name: i for i, family in enumerate(FAMILIES)}


def escape(value: str) -> str:
    """A label value as the text format requires it: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{name}="{escape(value)}"' for name, value in pairs)


def _job_pairs(job: RunningJob) -> list[tuple[str, str]]:
    return list(zip(JOB_LABELS, (job.cluster, job.job_id, job.user, job.account, job.partition), strict=True))


Line = tuple[int, str]
"""A series: its family's index in :data:`FAMILIES` and its line."""


@dataclass
class _PerJob:
    gpus: list[GpuLatest]
    ranks: list[RankLatest]
    findings: list[OpenFindings]


def _gpu_lines(head: str, gpu: GpuLatest) -> list[Line]:
    where = f'{head},node="{escape(gpu.node)}",gpu="{escape(gpu.gpu)}"'
    values = (("jobsight_job_gpu_utilization_ratio", gpu.util_ratio),
              ("jobsight_job_gpu_memory_used_bytes", gpu.mem_used_bytes),
              ("jobsight_job_gpu_memory_total_bytes", gpu.mem_total_bytes),
              ("jobsight_job_gpu_power_watts", gpu.power_watts),
              ("jobsight_job_gpu_sm_clock_hertz", gpu.sm_clock_hertz))
    out = [(_INDEX[family], f"{family}{{{where}}} {number(value)}") for family, value in values if value is not None]
    out += [(_INDEX["jobsight_job_gpu_throttle_reason"],
             f'jobsight_job_gpu_throttle_reason{{{where},reason="{escape(reason)}"}} 1')
            for reason in throttle_names(gpu.throttle_mask)]
    return out


def _rank_lines(head: str, rank: RankLatest) -> list[Line]:
    where = f'{head},rank="{rank.rank}"'
    out = [(_INDEX["jobsight_job_step_duration_seconds"],
            f"jobsight_job_step_duration_seconds{{{where}}} {number(rank.step_seconds)}"),
           (_INDEX["jobsight_job_last_step"], f"jobsight_job_last_step{{{where}}} {rank.last_step}")]
    if rank.data_wait_ratio is not None:
        out.append((_INDEX["jobsight_job_step_data_wait_ratio"],
                    f"jobsight_job_step_data_wait_ratio{{{where}}} {number(rank.data_wait_ratio)}"))
    return out


def _energy_lines(head: str, energy: JobEnergy | None, grams_per_joule: float | None) -> list[Line]:
    if energy is None:
        return []
    out: list[Line] = []
    for family, value in (("jobsight_job_gpu_energy_joules_total", energy.gpu_joules),
                          ("jobsight_job_node_energy_joules_total", energy.node_joules)):
        if value is not None:
            out.append((_INDEX[family], f"{family}{{{head}}} {number(max(value, 0.0))}"))
    known = [v for v in (energy.gpu_joules, energy.node_joules) if v is not None]
    if grams_per_joule is not None and known:
        out.append((_INDEX["jobsight_job_emissions_grams_total"],
                    f"jobsight_job_emissions_grams_total{{{head}}} {number(max(sum(known), 0.0) * grams_per_joule)}"))
    return out


def job_series(job: RunningJob, parts: _PerJob, energy: JobEnergy | None, grams_per_joule: float | None) -> list[Line]:
    """Every series of ``job``."""
    head = _labels(_job_pairs(job))
    out: list[Line] = [(_INDEX["jobsight_job_info"], f'jobsight_job_info{{{head},name="{escape(job.name)}"}} 1')]
    for gpu in parts.gpus:
        out += _gpu_lines(head, gpu)
    for rank in parts.ranks:
        out += _rank_lines(head, rank)
    out += [(_INDEX["jobsight_job_open_findings"],
             f'jobsight_job_open_findings{{{head},rule="{escape(f.rule)}",severity="{escape(f.severity)}"}} {f.count}')
            for f in parts.findings]
    out += _energy_lines(head, energy, grams_per_joule)
    return out


@dataclass(frozen=True)
class Rendered:
    text: str
    jobs: int
    series: int
    jobs_left_out: int
    series_left_out: int


def render(now: JobsNow, energy: Mapping[JobKey, JobEnergy], grams_per_joule: float | None, max_series: int,
           left_out_total: int) -> Rendered:
    """The exposition of ``now``: whole jobs in ``now.jobs``' order while they fit in ``max_series``,
    then the exposition's own series (``left_out_total``: the series left out before this scrape,
    which the counter adds this scrape's to)."""
    parts: dict[JobKey, _PerJob] = defaultdict(lambda: _PerJob([], [], []))
    for gpu in now.gpus:
        parts[gpu.key].gpus.append(gpu)
    for rank in now.ranks:
        parts[rank.key].ranks.append(rank)
    for finding in now.findings:
        parts[finding.key].findings.append(finding)
    by_family: list[list[str]] = [[] for _ in FAMILIES]
    shown = jobs_left_out = series_left_out = jobs = 0
    for job in now.jobs:
        key = (job.cluster, job.job_id)
        lines = job_series(job, parts[key], energy.get(key), grams_per_joule)
        if shown + len(lines) > max_series:
            jobs_left_out += 1
            series_left_out += len(lines)
            continue
        jobs += 1
        shown += len(lines)
        for index, line in lines:
            by_family[index].append(line)
    out: list[str] = []
    for family, family_lines in zip(FAMILIES, by_family, strict=True):
        out += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}", *family_lines]
    out += [
        "# HELP jobsight_exposition_jobs Running jobs in this scrape",
        "# TYPE jobsight_exposition_jobs gauge", f"jobsight_exposition_jobs {jobs}",
        "# HELP jobsight_exposition_jobs_left_out Running jobs this scrape left out (the series cap)",
        "# TYPE jobsight_exposition_jobs_left_out gauge", f"jobsight_exposition_jobs_left_out {jobs_left_out}",
        "# HELP jobsight_exposition_series_left_out_total Series left out by the cap, in this process's scrapes",
        "# TYPE jobsight_exposition_series_left_out_total counter",
        f"jobsight_exposition_series_left_out_total {left_out_total + series_left_out}",
    ]
    return Rendered("\n".join(out) + "\n", jobs, shown, jobs_left_out, series_left_out)
