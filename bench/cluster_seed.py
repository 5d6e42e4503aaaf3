"""The hourly compaction pass under a cluster's load, for ``bench/cluster.py --pack``.

Before the ramp, the previous UTC hour is filled, in SQL, with what the simulated nodes would
have sent in it (the last ``minutes`` of it: 8 GPU samples and a host sample per node and
second, their minute rollup as the ingest path keeps it); at the top step the bench runs the
pass the collector runs on its timer (:func:`jobsight.collector.tiers.compaction.run_pass`, the
collector's own timer off so that this is the only pass) while the nodes keep streaming the
current hour. The step is measured until the pass has ended, so its p99 covers all of it.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass, field

import psycopg
from psycopg.rows import dict_row

from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction
from jobsight.collector.tiers.rollup import rebuild_minutes

CLUSTER = "default"

# Values as NVML gives them (whole percents and degrees, W from mW, J from mJ); the GPUs of a node
# share its tick. Enough like a training job for the pass to do its usual work per block.
_GPU_SEED = """
INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, util_gpu, util_mem, mem_used,
                         mem_total, power_w, energy_j, temp_c, sm_clock_mhz, mem_clock_mhz, pcie_tx_kbs, pcie_rx_kbs,
                         throttle_reasons, ecc_errors, process_count, lost)
SELECT %(cluster)s, p.job, %(start)s + make_interval(secs => t) + (t * 7919 %% 1500) * interval '1 microsecond',
       p.node, g, 'GPU-' || md5(p.node || g)::uuid::text, 'NVIDIA H100 80GB HBM3',
       95 + (t + g) %% 6, 40 + (t * 7 + g) %% 9, 70000000000 + g * 2097152, 85520809984,
       (620000 + (t * 7727 + g * 3001) %% 60000) / 1000.0, (1e9 + t * 650123.0) / 1000.0, 60 + g %% 3,
       1980, 2619, 20000 + (t * 104729) %% 30000, 100000 + (t::int8 * 15485863) %% 400000, 0, 0, 1, false
FROM unnest(%(jobs)s::text[], %(nodes)s::text[]) AS p(job, node), generate_series(0, %(ticks)s - 1) t,
     generate_series(0, 7) g
"""

_HOST_SEED = """
INSERT INTO host_samples (cluster, job_id, ts, node, cpu_util, cpu_time_s, mem_used, mem_limit)
SELECT %(cluster)s, p.job, %(start)s + make_interval(secs => t) + (t * 7919 %% 1500) * interval '1 microsecond',
       p.node, 700 + t %% 50, t * 7.0, 322122547200 + (t / 600)::int8 * 1073741824, 1099511627776
FROM unnest(%(jobs)s::text[], %(nodes)s::text[]) AS p(job, node), generate_series(0, %(ticks)s - 1) t
"""


@dataclass
class Seed:
    gpu_samples: int
    host_samples: int
    until: dt.datetime
    """The end of the seeded hour: the start of the hour the nodes stream into."""
    seconds: float


def seed_previous_hour(database_url: str, jobs: dict[str, list[str]], minutes: int) -> Seed:
    """Fill the last ``minutes`` of the previous UTC hour for every node of ``jobs``."""
    began = time.monotonic()
    until = compaction.hour_floor(dt.datetime.now(dt.UTC))
    start = until - dt.timedelta(minutes=minutes)
    pairs = [(job, node) for job, nodes in jobs.items() for node in nodes]
    params = {"cluster": CLUSTER, "start": start, "ticks": minutes * 60,
              "jobs": [job for job, _ in pairs], "nodes": [node for _, node in pairs]}
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        keeper = PartitionKeeper()
        for table in compaction.RAW_TABLES:
            keeper.ensure(conn, table, [start.date()])
        gpu = conn.execute(_GPU_SEED, params).rowcount
        host = conn.execute(_HOST_SEED, params).rowcount
        for job in jobs:
            rebuild_minutes(conn, CLUSTER, job)
        conn.execute("VACUUM ANALYZE")
    return Seed(gpu, host, until, time.monotonic() - began)


@dataclass
class PackingPass:
    """One compaction pass on its own thread, packing every hour before ``until``."""

    database_url: str
    until: dt.datetime
    report: compaction.PassReport | None = None
    error: BaseException | None = None
    seconds: float = 0.0
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-pass", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        began = time.monotonic()
        try:
            with psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row) as conn:
                self.report = compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0),
                                                  packed_retention_days=0, now=self.until)
        except BaseException as exc:  # noqa: BLE001 - printed by the bench
            self.error = exc
        self.seconds = time.monotonic() - began

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def describe(self) -> str:
        if self.error is not None:
            return f"the pass failed after {self.seconds:.0f} s: {type(self.error).__name__}: {self.error}"
        if self.report is None:
            return "the pass did not run"
        samples = sum(d.samples for d in self.report.days)
        hosts = sum(d.host_samples for d in self.report.days)
        spans = ", ".join(f"{d.day} until {d.until:%H:%M} ({'emptied' if d.whole else 'rows deleted'})"
                          for d in self.report.days)
        rate = samples / self.seconds if self.seconds else 0.0
        return (f"hourly pass during the step: {samples:,} GPU samples and {hosts:,} host samples packed in "
                f"{self.seconds:.0f} s ({rate:,.0f} samples/s); {spans}")
