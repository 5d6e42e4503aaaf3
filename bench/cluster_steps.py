"""One step of bench/cluster.py: what is read at its start and end, and what is printed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench import cluster_probe as probe

P99_LIMIT_S = 1.0
SPOOLED_LIMIT_S = 10.0
MISSED_TICKS_LIMIT = 0.02
"""Above this share of ticks missed by the generator, the step measures the generator."""


@dataclass
class Reading:
    at: float
    metrics: probe.Scrape
    cpu: dict[int, float]
    load: dict[str, Any]


@dataclass
class Step:
    nodes: int
    seconds: float
    stored_per_s: float
    generated_per_s: float
    requests_per_s: float
    p50_s: float
    p99_s: float
    client_p50_s: float
    client_p99_s: float
    collector_cores: float
    postgres_cores: float
    load_cores: float
    bytes_raw: float
    bytes_rollup: float
    lost: int
    spooled_batches: int
    longest_spooled_s: float
    missed_share: float
    verdict: str


def measure(database_url: str, nodes: int, before: Reading, after: Reading, roots: dict[str, list[int]],
            gpu_rows: float) -> Step:
    """One step from the readings at its start and end; ``gpu_rows`` is every GPU sample stored so far."""
    elapsed = after.at - before.at
    gpu_stored = after.metrics.records.get("gpu_sample", 0.0) - before.metrics.records.get("gpu_sample", 0.0)
    load = after.load
    generated = load["gpu_records"] - before.load["gpu_records"]
    times = load["post_times"]  # the post times since the previous mark: this step's
    lost = load["dropped_records"] + load["rejected_batches"] + load["quarantined_batches"]
    expected_ticks = nodes * elapsed
    missed = (load["missed_ticks"] - before.load["missed_ticks"]) / expected_ticks if expected_ticks else 0.0
    raw_bytes, minute_bytes = probe.sizes(database_url)

    def cores(name: str) -> float:
        picked = {pid: after.cpu[pid] for pid in roots[name]}
        return probe.cores(picked, before.cpu, elapsed)

    step = Step(
        nodes=nodes, seconds=elapsed, stored_per_s=gpu_stored / elapsed, generated_per_s=generated / elapsed,
        requests_per_s=(after.metrics.batches - before.metrics.batches) / elapsed,
        p50_s=probe.histogram_quantile(0.5, before.metrics.buckets, after.metrics.buckets),
        p99_s=probe.histogram_quantile(0.99, before.metrics.buckets, after.metrics.buckets),
        client_p50_s=probe.quantile(times, 0.5), client_p99_s=probe.quantile(times, 0.99),
        collector_cores=cores("collector"), postgres_cores=cores("postgres"), load_cores=cores("load"),
        bytes_raw=probe.per_sample(raw_bytes, gpu_rows), bytes_rollup=probe.per_sample(minute_bytes, gpu_rows),
        lost=lost, spooled_batches=load["spooled_batches"] - before.load["spooled_batches"],
        longest_spooled_s=load["longest_spooled_s"],
        missed_share=missed, verdict="ok",
    )
    step.verdict = verdict(step)
    return step


def unanswered(nodes: int, why: str) -> Step:
    nan = math.nan
    return Step(nodes, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, 0, 0, nan, 0.0, why)


def verdict(step: Step) -> str:
    if step.lost:
        return f"LOST {step.lost} records/batches"
    if step.longest_spooled_s > SPOOLED_LIMIT_S:
        return f"SPOOLED {step.longest_spooled_s:.0f} s"
    if step.p99_s > P99_LIMIT_S:
        return f"P99 {step.p99_s:.2f} s > {P99_LIMIT_S:g} s"
    if step.missed_share > MISSED_TICKS_LIMIT:
        return f"GENERATOR BEHIND ({step.missed_share:.0%} ticks missed)"
    return "ok"


HEADER = (f"{'nodes':>6} {'GPU/s gen':>9} {'stored':>8} {'req/s':>6} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'cli p50':>7} {'cli p99':>7} {'coll cpu':>8} {'pg cpu':>6} {'load cpu':>8} {'B/sample':>12} "
          f"{'spooled':>7}  verdict")


def number(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return ">10000" if math.isinf(seconds) else f"{seconds * 1000:.0f}"


def row(step: Step) -> str:
    sizes = f"{number(step.bytes_raw, '.0f')}+{number(step.bytes_rollup, '.0f')}"
    return (f"{step.nodes:>6} {number(step.generated_per_s, ',.0f'):>9} {number(step.stored_per_s, ',.0f'):>8} "
            f"{number(step.requests_per_s, ',.0f'):>6} {ms(step.p50_s):>7} {ms(step.p99_s):>7} "
            f"{ms(step.client_p50_s):>7} {ms(step.client_p99_s):>7} {number(step.collector_cores, '.2f'):>8} "
            f"{number(step.postgres_cores, '.2f'):>6} {number(step.load_cores, '.2f'):>8} {sizes:>12} "
            f"{step.spooled_batches:>7}  {step.verdict}")
