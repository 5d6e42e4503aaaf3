"""Collector ingest throughput against raw COPY, measured in the same run.

Prints rows/s for POST /v1/ingest with 1,000-sample gpu_sample batches (pre-encoded,
sent over one keep-alive connection) and rows/s for psycopg binary COPY of the same
rows into the same table, one transaction per 1,000 rows, and their ratio.
Usage: python bench/ingest.py [batches]
"""

from __future__ import annotations

import gzip
import http.client
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402

from bench.stack import running_stack  # noqa: E402
from jobsight.collector.ingest import COPY_TYPES, copy_sql, prepare  # noqa: E402
from jobsight.protocol.wire import decode_batch, encode_batch, now_us  # noqa: E402

BATCH = 1000


def gpu_records(job: str, start_us: int, count: int) -> list[dict[str, Any]]:
    return [
        {"kind": "gpu_sample", "job": job, "ts": start_us + i * 1000, "node": "node001", "gpu_index": i % 8,
         "gpu_uuid": f"GPU-{i % 8:08d}", "gpu_name": "NVIDIA H100 80GB HBM3", "util_gpu": float(i % 100),
         "util_mem": 31.0, "mem_used": 40 * 2**30, "mem_total": 80 * 2**30, "power_w": 512.3,
         "energy_j": 1e6 + i, "temp_c": 61.0, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "pcie_tx_kbs": 1200,
         "pcie_rx_kbs": 3400, "throttle_reasons": 0, "ecc_errors": 0, "process_count": 1}
        for i in range(count)
    ]


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    with running_stack() as stack:
        start = now_us() - 3600 * 1_000_000
        bodies = [encode_batch("bench", seq, gpu_records("bench-api", start + seq * BATCH * 1000, BATCH))
                  for seq in range(batches)]
        target = urlparse(stack.url)
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
        headers = {"Authorization": f"Bearer {stack.token}", "Content-Encoding": "gzip",
                   "Content-Type": "application/json"}
        # Warm up: the first batch creates the day's partitions.
        conn.request("POST", "/v1/ingest", body=encode_batch("warm", 0, gpu_records("warm", start, 10)),
                     headers=headers)
        conn.getresponse().read()
        began = time.perf_counter()
        for body in bodies:
            conn.request("POST", "/v1/ingest", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise SystemExit(f"ingest failed: {response.status}")
        api_s = time.perf_counter() - began

        rows = [prepare(decode_batch(gzip.decompress(body))).rows["gpu_samples"]
                for body in bodies]
        rows = [[(r[0], "bench-copy", *r[2:]) for r in batch] for batch in rows]
        with psycopg.connect(stack.database_url) as db:
            began = time.perf_counter()
            for batch in rows:
                with db.transaction(), db.cursor() as cur, cur.copy(copy_sql("gpu_samples")) as copy:
                    copy.set_types(COPY_TYPES["gpu_samples"])
                    for row in batch:
                        copy.write_row(row)
            copy_s = time.perf_counter() - began
            stored = db.execute("SELECT count(*) FROM gpu_samples WHERE job_id = 'bench-api'").fetchone()
        total = batches * BATCH
        if stored is None or stored[0] != total:
            raise SystemExit(f"expected {total} rows through the API, found {stored}")
        api_rate, copy_rate = total / api_s, total / copy_s
        print(f"rows: {total} in {batches} batches of {BATCH}")
        print(f"collector ingest: {api_rate:,.0f} rows/s  (HTTP + gzip + validation + COPY, one client)")
        print(f"raw binary COPY:  {copy_rate:,.0f} rows/s  (psycopg, same rows, same table)")
        print(f"ratio ingest/COPY: {api_rate / copy_rate:.2f}")


if __name__ == "__main__":
    main()
