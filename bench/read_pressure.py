"""Node ingest latency with and without a job token's heaviest reads, measured in the same run.

Starts its own stack (embedded PostgreSQL and a collector with the default settings), stores the job
of issue #40's report: 16,000 epochs (a step each) over 2,882 GPU samples with energy counters,
registered on node ``n1``. Then node ``n1`` posts one-sample batches of the job with its node token,
one after another over one keep-alive connection: first alone, then while ``--readers`` processes
(default 8, the size the collector's one pool had) each ask for ``GET /v1/jobs/{job}/epochs`` with
the job's token, again and again. Prints node ingest p50 and p99 of both, their ratio, the answers
that were not 200, and what the reads cost and answered.
With ``--read ''`` the readers ask for the job itself (``GET /v1/jobs/{job}``), a light read, to
compare: what ingest meets under as many ordinary reads.
Usage: python bench/read_pressure.py [batches] [--readers N] [--epochs N] [--samples N] [--read epochs|'']
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import proc_stat  # noqa: E402
from bench.stack import Stack, running_stack  # noqa: E402
from jobsight.protocol.tokens import mint_job_token, mint_node_token  # noqa: E402
from jobsight.protocol.wire import encode_batch, now_us  # noqa: E402

S = 1_000_000
JOB = "bench-read-pressure"
CHUNK = 10_000


def heavy_job(epochs: int, samples: int, t0: int) -> list[dict[str, Any]]:
    """The job: registered on n1, ``epochs`` one-step epochs a second apart, ``samples`` GPU samples
    with energy counters spread over them."""
    records: list[dict[str, Any]] = [{"kind": "job_started", "job": JOB, "ts": t0, "node": "n1", "user": "bench",
                                      "nodes": ["n1"], "gpus": ["0"]}]
    records += [{"kind": "step", "job": JOB, "ts": t0 + (1 + e) * S, "node": "n1", "rank": 0, "step": e, "epoch": e,
                 "phase": "train", "duration_s": 1.0, "samples": 32} for e in range(epochs)]
    every_us = (epochs + 2) * S // samples
    records += [{"kind": "gpu_sample", "job": JOB, "ts": t0 + i * every_us, "node": "n1", "gpu_index": 0,
                 "gpu_uuid": "GPU-bench", "util_gpu": 90.0, "power_w": 300.0, "energy_j": 300.0 * i * every_us / S}
                for i in range(samples)]
    return records


class Client:
    """One keep-alive connection to the collector with one token."""

    def __init__(self, stack: Stack, token: str) -> None:
        target = urlparse(stack.url)
        self.conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
        self.headers = {"Authorization": f"Bearer {token}"}

    def post(self, body: bytes) -> tuple[int, float]:
        began = time.perf_counter()
        self.conn.request("POST", "/v1/ingest", body=body, headers={**self.headers, "Content-Encoding": "gzip"})
        response = self.conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - began

    def get(self, path: str) -> tuple[int, float, bytes]:
        began = time.perf_counter()
        self.conn.request("GET", path, headers=self.headers)
        response = self.conn.getresponse()
        body = response.read()
        return response.status, time.perf_counter() - began, body


def ingest(stack: Stack, token: str, batches: int, first_seq: int) -> tuple[list[float], Counter[int]]:
    """Node n1's one-sample batches, one after another: their latencies (200s only) and every status."""
    client = Client(stack, token)
    took: list[float] = []
    statuses: Counter[int] = Counter()
    for i in range(batches):
        sample = {"kind": "gpu_sample", "job": JOB, "ts": now_us(), "node": "n1", "gpu_index": 0,
                  "gpu_uuid": "GPU-bench", "util_gpu": 50.0}
        status, seconds = client.post(encode_batch("bench-node", first_seq + i, [sample]))
        statuses[status] += 1
        if status == 200:
            took.append(seconds)
    return took, statuses


def read_until(url: str, token: str, path: str, stop: Any) -> list[tuple[int, float]]:
    """The heaviest read a job token can make, again and again until ``stop``: each answer's status and
    time. Runs in a process of its own at the lowest CPU priority: on a site the readers are other
    machines, here they share the collector's cores, and their own work must not be counted as the
    collector's slowness."""
    os.nice(19)
    target = urlparse(url)
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
    answers = []
    while not stop.is_set():
        began = time.perf_counter()
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        answers.append((response.status, time.perf_counter() - began))
    return answers


def cpu_seconds(pid: int | None, *, with_children: bool = False) -> float:
    """User + system CPU seconds of ``pid`` (and of its live children: a PostgreSQL server's backends)."""
    if pid is None:
        return 0.0
    return sum(stat.cpu_s for stat in proc_stat.every().values()
               if stat.pid == pid or (with_children and stat.ppid == pid))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def describe(took: list[float], statuses: Counter[int]) -> str:
    if not took:
        return f"no batch stored; answers {dict(statuses)}"
    others = {s: n for s, n in statuses.items() if s != 200}
    return (f"{len(took)} stored, p50 {statistics.median(took) * 1000:.1f} ms, "
            f"p99 {percentile(took, 0.99) * 1000:.1f} ms" + (f"; NOT 200: {others}" if others else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batches", type=int, nargs="?", default=300)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=16_000)
    parser.add_argument("--read", choices=["epochs", ""], default="epochs",
                        help="what the readers ask for: the job's epochs (the heaviest read), or '' for the job "
                             "itself (a light read, to compare with)")
    parser.add_argument("--samples", type=int, default=2_882)
    args = parser.parse_args()
    with running_stack() as stack:
        secret = stack.secret_file.read_text().strip()
        node_token = mint_node_token(secret, "default", "n1")
        job_token = mint_job_token(secret, "default", JOB, 3600)
        t0 = now_us() - (args.epochs + 120) * S
        seed = heavy_job(args.epochs, args.samples, t0)
        admin = Client(stack, stack.token)
        for seq, i in enumerate(range(0, len(seed), CHUNK), start=1):
            status, _ = admin.post(encode_batch("bench-seed", seq, seed[i:i + CHUNK]))
            if status != 200:
                raise SystemExit(f"seeding answered {status}")
        status, alone_s, body = Client(stack, job_token).get(f"/v1/jobs/{JOB}/epochs")
        answer = json.loads(body) if status == 200 else {}
        print(f"job: {args.epochs:,} epochs, {args.samples:,} GPU samples; one epochs read alone: {status} in "
              f"{alone_s:.2f} s, {len(answer.get('epochs', [])):,} epochs listed"
              + (f", {answer['epochs_left_out']['epochs']:,} left out" if answer.get("epochs_left_out") else ""))

        ingest(stack, node_token, 20, 1)  # warm-up: connections, the allocation cache
        quiet, quiet_statuses = ingest(stack, node_token, args.batches, 1_000)
        spawn = multiprocessing.get_context("spawn")
        stop = spawn.Manager().Event()
        collector_pid = stack.process.pid if stack.process else None
        with ProcessPoolExecutor(args.readers, mp_context=spawn) as readers:
            path = f"/v1/jobs/{JOB}/{args.read}".rstrip("/")
            reads = [readers.submit(read_until, stack.url, job_token, path, stop) for _ in range(args.readers)]
            time.sleep(3.0)  # every reader started and has a read in the collector
            cpu_before = (cpu_seconds(collector_pid), cpu_seconds(collector_pid, with_children=True),
                          cpu_seconds(stack.postgres_pid(), with_children=True))
            began = time.perf_counter()
            busy, busy_statuses = ingest(stack, node_token, args.batches, 100_000)
            busy_s = time.perf_counter() - began
            collector_cpu = cpu_seconds(collector_pid) - cpu_before[0]
            workers_cpu = cpu_seconds(collector_pid, with_children=True) - cpu_before[1] - collector_cpu
            postgres_cpu = cpu_seconds(stack.postgres_pid(), with_children=True) - cpu_before[2]
            stop.set()
            answers = [a for r in reads for a in r.result()]
        read_statuses = Counter(a[0] for a in answers)
        read_times = [a[1] for a in answers if a[0] == 200]
        print(f"node ingest alone:                {describe(quiet, quiet_statuses)}")
        print(f"node ingest with {args.readers} {'heavy' if args.read else 'light'} reads: "
              f"{describe(busy, busy_statuses)}")
        if quiet and busy:
            print(f"ratio with reads / alone: p50 {statistics.median(busy) / statistics.median(quiet):.1f}x, "
                  f"p99 {percentile(busy, 0.99) / percentile(quiet, 0.99):.1f}x")
        print(f"CPU while reads ran ({busy_s:.1f} s): collector process {collector_cpu:.1f} s, its read workers "
              f"{workers_cpu:.1f} s, PostgreSQL {postgres_cpu:.1f} s")
        print(f"reads meanwhile: {len(answers)} answered {dict(read_statuses)}"
              + (f", p50 {statistics.median(read_times):.2f} s" if read_times else ""))


if __name__ == "__main__":
    main()
