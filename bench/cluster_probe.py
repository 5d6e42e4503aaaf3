"""What bench/cluster.py measures from outside the collector: CPU of process trees from
/proc, the collector's /metrics, and sizes and counts in PostgreSQL."""

from __future__ import annotations

import datetime as dt
import math
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench import proc_stat

# -- CPU --------------------------------------------------------------------------------

def _proc_table() -> dict[int, tuple[int, float]]:
    """Every process now: pid -> (parent pid, CPU seconds of it and of its reaped children)."""
    return {pid: (stat.ppid, stat.cpu_s + stat.reaped_s) for pid, stat in proc_stat.every().items()}


def tree_cpu_seconds(roots: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system) of each root's process tree, as of now.

    A process's own time plus its reaped children's (``cutime``/``cstime``), summed over the
    live tree: a PostgreSQL backend or worker that ends during a step stays counted, in its
    parent's children time.
    """
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    totals: dict[int, float] = {}
    for root in roots:
        total, todo = 0.0, [root]
        while todo:
            pid = todo.pop()
            if pid in table:
                total += table[pid][1]
                todo.extend(children.get(pid, ()))
        totals[root] = total
    return totals


# -- /metrics ---------------------------------------------------------------------------

@dataclass
class Scrape:
    records: dict[str, float]
    """Records stored, by kind (cumulative)."""
    batches: float
    buckets: list[tuple[float, float]]
    """The ingest latency histogram: (upper bound, cumulative count), +Inf last."""
    rejects: float
    workers: float


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    records: dict[str, float] = {}
    buckets: list[tuple[float, float]] = []
    batches = rejects = workers = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "jobsight_records_ingested_total":
                records[sample.labels["kind"]] = sample.value
            elif sample.name == "jobsight_batches_total":
                batches += sample.value
            elif sample.name == "jobsight_ingest_rejects_total":
                rejects += sample.value
            elif sample.name == "jobsight_collector_workers":
                workers = sample.value
            elif sample.name == "jobsight_ingest_batch_seconds_bucket":
                buckets.append((float(sample.labels["le"]), sample.value))
    buckets.sort()
    return Scrape(records, batches, buckets, rejects, workers)


def histogram_quantile(q: float, before: Sequence[tuple[float, float]], after: Sequence[tuple[float, float]]) -> float:
    """The ``q`` quantile of the observations made between two scrapes, interpolated inside
    its bucket as Prometheus' ``histogram_quantile`` does; ``inf`` past the last finite bound,
    ``nan`` without observations."""
    earlier = dict(before)
    deltas = [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in deltas:
        if cumulative >= rank:
            if math.isinf(bound):
                return math.inf
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return math.inf


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); ``nan`` when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# -- PostgreSQL -------------------------------------------------------------------------

def relation_bytes(conn: psycopg.Connection[Any], table: str) -> int:
    """Heap, indexes and TOAST of a partitioned table: the sum over its partitions (the
    parent itself has no storage)."""
    row = conn.execute(
        """SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits
           WHERE inhparent = %s::regclass""",
        (table,),
    ).fetchone()
    return int(row[0]) if row else 0


def count(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any] | None = None) -> int:
    row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


@dataclass
class Stored:
    gpu_samples: int
    gpu_sample_duplicates: int
    """Rows beyond the first of each (job, node, gpu_index, ts)."""
    host_samples: int
    steps: int
    logs: int
    gpu_bytes: int
    minute_bytes: int


def stored(database_url: str, since: dt.datetime | None = None) -> Stored:
    """What the database holds of the run's records; ``since``: only samples from then (the ones
    before are the previous hour ``--pack`` seeded)."""
    after = "WHERE ts >= %(since)s"
    since_ = {"since": since or dt.datetime.min.replace(tzinfo=dt.UTC)}
    with psycopg.connect(database_url) as conn:
        return Stored(
            gpu_samples=count(conn, f"SELECT count(*) FROM gpu_samples {after}", since_),
            gpu_sample_duplicates=count(
                conn,
                f"""SELECT sum(n - 1) FROM (SELECT count(*) AS n FROM gpu_samples {after}
                   GROUP BY job_id, node, gpu_index, ts HAVING count(*) > 1) AS twice""",
                since_,
            ),
            host_samples=count(conn, f"SELECT count(*) FROM host_samples {after}", since_),
            steps=count(conn, "SELECT count(*) FROM steps"),
            logs=count(conn, "SELECT count(*) FROM log_events WHERE logger LIKE 'sim.%'"),
            gpu_bytes=relation_bytes(conn, "gpu_samples"),
            minute_bytes=relation_bytes(conn, "gpu_minutes"),
        )


def sizes(database_url: str) -> tuple[int, int]:
    """Bytes of gpu_samples and of gpu_minutes now (cheap: no row count)."""
    with psycopg.connect(database_url) as conn:
        return relation_bytes(conn, "gpu_samples"), relation_bytes(conn, "gpu_minutes")


def per_sample(total_bytes: float, rows: float) -> float:
    return total_bytes / rows if rows else math.nan


def cores(seconds: Mapping[int, float], before: Mapping[int, float], elapsed: float) -> float:
    """CPU seconds used between two readings per second of wall time (1.0 = one busy core)."""
    return sum(seconds[pid] - before.get(pid, 0.0) for pid in seconds) / elapsed if elapsed > 0 else math.nan
