"""Collector ingest throughput against raw COPY, measured in the same run.

The collector (``--workers 2`` by default: one per core of a two-core machine, as docs/scale.md
sizes it) gets 1,000-sample gpu_sample batches, pre-encoded, from ``--clients`` concurrent
clients (default 8), each over its own keep-alive connection: a cluster's nodes post at once,
and the collector's group commit is built for that. Batch ``i`` comes from node
``node{i % clients}`` of one job, so all clients write under the job's one row and each its
own GPUs' rollup rows, as nodes do. One client alone is measured too.

The baselines are psycopg binary COPY of exactly the rows the collector stores (built by its
own ``prepare``) into the same table, one transaction per 1,000 rows: on one connection (the
headline ratio), and on as many connections as clients (threads) for comparison. The API
and the COPYs take turns (``--rounds``), so a machine shared with other work slows both alike;
the median of the rounds' ratios is printed beside the overall one.
Usage: python bench/ingest.py [batches] [--clients N] [--workers N] [--rounds N]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402

from bench.stack import Stack, running_stack  # noqa: E402
from jobsight.collector.ingest.rows import PG_EPOCH_US  # noqa: E402
from jobsight.collector.ingest.write import COPY_TYPES, copy_sql, prepare  # noqa: E402
from jobsight.collector.store.schema import gpu_samples  # noqa: E402
from jobsight.collector.store.timestamps import ts_from_us  # noqa: E402
from jobsight.protocol.wire import decode_batch, encode_batch, now_us  # noqa: E402

BATCH = 1000
DATED_TYPES = ["timestamptz" if name == "ts" else t for name, t in zip(
    [c.name for c in gpu_samples.columns], COPY_TYPES["gpu_samples"], strict=True)]


def gpu_records(job: str, start_us: int, count: int, node: str = "node001") -> list[dict[str, Any]]:
    return [
        {"kind": "gpu_sample", "job": job, "ts": start_us + i * 1000, "node": node, "gpu_index": i % 8,
         "gpu_uuid": f"GPU-{i % 8:08d}", "gpu_name": "NVIDIA H100 80GB HBM3", "util_gpu": float(i % 100),
         "util_mem": 31.0, "mem_used": 40 * 2**30, "mem_total": 80 * 2**30, "power_w": 512.3,
         "energy_j": 1e6 + i, "temp_c": 61.0, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "pcie_tx_kbs": 1200,
         "pcie_rx_kbs": 3400, "throttle_reasons": 0, "ecc_errors": 0, "process_count": 1}
        for i in range(count)
    ]


def in_parallel(count: int, work: Callable[[int], None]) -> float:
    """Run ``work(0..count-1)`` on ``count`` threads; the wall time until all are done."""
    with ThreadPoolExecutor(count) as pool:
        began = time.perf_counter()
        for future in [pool.submit(work, index) for index in range(count)]:
            future.result()
        return time.perf_counter() - began


def post_all(stack: Stack, bodies: list[bytes], clients: int) -> float:
    """Seconds to post every body, ``clients`` at a time, each client on its own connection."""
    target = urlparse(stack.url)
    headers = {"Authorization": f"Bearer {stack.token}", "Content-Encoding": "gzip",
               "Content-Type": "application/json"}

    def client(index: int) -> None:
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
        for body in bodies[index::clients]:
            conn.request("POST", "/v1/ingest", body=body, headers=headers)
            response = conn.getresponse()
            answer = response.read()
            if response.status != 200:
                raise SystemExit(f"ingest failed: {response.status} {answer[:300]!r}")
        conn.close()

    return in_parallel(clients, client)


def copy_all(database_url: str, batches: list[list[tuple[Any, ...]]], connections: int,
             types: list[str] = COPY_TYPES["gpu_samples"]) -> float:
    """Seconds to COPY every batch, one transaction each, on ``connections`` connections."""
    dbs = [psycopg.connect(database_url) for _ in range(connections)]

    def copier(index: int) -> None:
        db = dbs[index]
        for rows in batches[index::connections]:
            with db.transaction(), db.cursor() as cur, cur.copy(copy_sql("gpu_samples")) as copy:
                copy.set_types(types)
                for row in rows:
                    copy.write_row(row)

    try:
        return in_parallel(connections, copier)
    finally:
        for db in dbs:
            db.close()


def bodies_for(job: str, source: str, start: int, batches: int, clients: int) -> list[bytes]:
    return [encode_batch(source, seq, gpu_records(job, start + seq * BATCH * 1000, BATCH, f"node{seq % clients:03d}"))
            for seq in range(batches)]


def copy_rows(bodies: list[bytes], job: str) -> list[list[tuple[Any, ...]]]:
    """The rows the collector stores for ``bodies``, under another job id."""
    rows = [prepare(decode_batch(gzip.decompress(body))).rows["gpu_samples"] for body in bodies]
    return [[(r[0], job, *r[2:]) for r in batch] for batch in rows]


def with_datetimes(batches: list[list[tuple[Any, ...]]], job: str) -> list[list[tuple[Any, ...]]]:
    """The same rows with ``ts`` a ``datetime`` (the collector sends it as COPY's int8 form):
    what the previous version of this bench copied, for comparison."""
    return [[(r[0], job, ts_from_us(r[2] + PG_EPOCH_US), *r[3:]) for r in batch] for batch in batches]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batches", nargs="?", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8,
                        help="API and COPY take turns this many times, so both see the same background load")
    args = parser.parse_args()
    with running_stack(workers=args.workers) as stack:
        start = now_us() - 3600 * 1_000_000
        bodies = bodies_for("bench-api", "bench", start, args.batches, args.clients)
        serial = bodies_for("bench-serial", "bench-serial", start, max(args.batches // 4, args.rounds), args.clients)
        one_rows, many_rows = copy_rows(bodies, "bench-copy"), copy_rows(bodies, "bench-copy-n")
        dated_rows = with_datetimes(one_rows, "bench-copy-dt")
        # Warm up every worker: the first batches make the day's partitions.
        post_all(stack, bodies_for("warm", "warm", start, 4 * args.workers, 1), 2 * args.workers)
        took = {"api": 0.0, "serial": 0.0, "copy1": 0.0, "copyn": 0.0, "copydt": 0.0}
        ratios: list[float] = []
        for r in range(args.rounds):
            part = slice(r * args.batches // args.rounds, (r + 1) * args.batches // args.rounds)
            api_s = post_all(stack, bodies[part], args.clients)
            copy_s = copy_all(stack.database_url, one_rows[part], 1)
            took["api"] += api_s
            took["copy1"] += copy_s
            took["copyn"] += copy_all(stack.database_url, many_rows[part], args.clients)
            took["copydt"] += copy_all(stack.database_url, dated_rows[part], 1, DATED_TYPES)
            alone = slice(r * len(serial) // args.rounds, (r + 1) * len(serial) // args.rounds)
            took["serial"] += post_all(stack, serial[alone], 1)
            ratios.append(copy_s / api_s)
        with psycopg.connect(stack.database_url) as db:
            stored = db.execute("SELECT count(*) FROM gpu_samples WHERE job_id = 'bench-api'").fetchone()
            rolled = db.execute("SELECT sum(samples) FROM gpu_minutes WHERE job_id = 'bench-api'").fetchone()
        total = args.batches * BATCH
        if stored is None or stored[0] != total or rolled is None or rolled[0] != total:
            raise SystemExit(f"expected {total} rows and rolled-up samples through the API, found {stored}, {rolled}")
        api_rate, serial_rate = total / took["api"], len(serial) * BATCH / took["serial"]
        one_rate, many_rate, dated_rate = total / took["copy1"], total / took["copyn"], total / took["copydt"]
        print(f"rows: {total} in {args.batches} batches of {BATCH}; collector --workers {args.workers}; "
              f"{args.rounds} rounds of API then COPY")
        print(f"collector ingest: {api_rate:,.0f} rows/s  ({args.clients} clients; HTTP + gzip + validation + COPY)")
        print(f"collector ingest: {serial_rate:,.0f} rows/s  (1 client, {len(serial)} batches)")
        print(f"raw binary COPY:  {one_rate:,.0f} rows/s  (psycopg, same rows, same table, 1 connection)")
        print(f"raw binary COPY:  {many_rate:,.0f} rows/s  ({args.clients} connections)")
        print(f"raw binary COPY:  {dated_rate:,.0f} rows/s  (1 connection, ts as a datetime, as this bench used to)")
        print(f"ratio ingest/COPY: {api_rate / one_rate:.2f}  (median of rounds {statistics.median(ratios):.2f}; "
              f"vs {args.clients} COPY connections: {api_rate / many_rate:.2f}; "
              f"vs datetime COPY: {api_rate / dated_rate:.2f}; "
              f"1 client vs 1 connection: {serial_rate / one_rate:.2f})")
        print(f"rounds: {', '.join(f'{x:.2f}' for x in ratios)}")


if __name__ == "__main__":
    main()
