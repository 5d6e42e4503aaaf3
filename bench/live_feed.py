"""Keeps a bench's seeded jobs running: each second, through the collector's ingest, the next second of
what ``tests/dashboard/seed.seed_big_job`` wrote (a sample from every GPU, a step from every rank).

Without it a seeded job's data stops when it was seeded, and a few minutes into a bench the collector
rightly judges the job hung: its page then carries the hang's banner and evidence, and a bench that
times its pages one after another would time a healthy job first and a hung one later. Fed, every
load meets the same job: running, its steps arriving, its recent window full.
"""

from __future__ import annotations

import datetime as dt
import http.client
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

import psycopg

from bench.stack import Stack
from jobsight.protocol.wire import encode_batch
from tests.dashboard.seed import BigJob

GIB = 2**30


def _second(job: BigJob, start: dt.datetime, t: int) -> list[dict[str, Any]]:
    """Second ``t`` of the job (``start`` + t), as the seed's formulas have it: every GPU's sample and
    every rank's step (the straggler still slow; the seed's one-minute stall is not repeated)."""
    ts = int((start + dt.timedelta(seconds=t)).timestamp() * 1_000_000)
    records: list[dict[str, Any]] = []
    for g in range(job.gpus):
        node = f"{job.job_id}-n{g // job.gpus_per_node:03d}"
        local = g % job.gpus_per_node
        records.append({"kind": "gpu_sample", "job": job.job_id, "ts": ts, "node": node, "gpu_index": local,
                        "gpu_uuid": f"GPU-{g}", "gpu_name": "NVIDIA H100", "util_gpu": 60 + 35 * math.sin(t / 90 + g),
                        "util_mem": 40.0, "mem_used": (40 + local) * GIB, "mem_total": 80 * GIB,
                        "power_w": 500.0 + local * 10, "energy_j": t * 500.0, "temp_c": 60.0 + local})
        duration = 0.9 if g == job.straggler else 0.5 + 0.02 * math.sin(t / 30 + g)
        records.append({"kind": "step", "job": job.job_id, "ts": ts, "node": node, "rank": g, "pid": 1000 + g,
                        "step": t, "epoch": t // 600, "phase": "train", "duration_s": duration,
                        "data_wait_s": 0.05, "compute_s": 0.4, "samples": 32})
    return records


class _Feeder:
    def __init__(self, stack: Stack, cluster: str, jobs: list[BigJob]) -> None:
        self.cluster, self.jobs, self.stop = cluster, jobs, threading.Event()
        target = urlparse(stack.url)
        self.conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
        self.headers = {"Authorization": f"Bearer {stack.token}", "Content-Encoding": "gzip"}
        with psycopg.connect(stack.database_url) as db:
            self.starts = {job.job_id: db.execute("SELECT start_time FROM jobs WHERE cluster = %s AND job_id = %s",
                                                  (cluster, job.job_id)).fetchone()[0] for job in jobs}
        # The seed wrote seconds 0 … seconds-1 ending at its "now": go on from the next second not written.
        self.next = {job.job_id: job.seconds for job in jobs}
        self.seq, self.failures = 0, 0

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for job in self.jobs:
                start = self.starts[job.job_id]
                due = int((dt.datetime.now(dt.UTC) - start).total_seconds())
                for t in range(self.next[job.job_id], due + 1):
                    self._post(_second(job, start, t))
                self.next[job.job_id] = max(self.next[job.job_id], due + 1)

    def _post(self, records: list[dict[str, Any]]) -> None:
        self.seq += 1
        try:
            body = encode_batch("bench-live-feed", self.seq, records, self.cluster)
            self.conn.request("POST", "/v1/ingest", body=body, headers=self.headers)
            response = self.conn.getresponse()
            response.read()
            if response.status != 200:
                self.failures += 1
        except OSError:
            self.failures += 1
            self.conn.close()


@contextmanager
def live_feed(stack: Stack, cluster: str, jobs: list[BigJob]) -> Iterator[_Feeder]:
    """Feed ``jobs`` each second until the block ends; yields the feeder (its ``failures`` count the
    batches the collector did not take)."""
    feeder = _Feeder(stack, cluster, jobs)
    thread = threading.Thread(target=feeder.run, name="bench-live-feed", daemon=True)
    thread.start()
    try:
        yield feeder
    finally:
        feeder.stop.set()
        thread.join(timeout=30)
        feeder.conn.close()
