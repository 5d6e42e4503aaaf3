"""Bytes per GPU sample (and per host sample), all in, for the raw tier and the packed tier of the same job.

    python bench/storage.py                  # 64 GPUs x 6 h at 1 Hz, with and without GPM
    python bench/storage.py --hours 1        # a quick look

An embedded PostgreSQL gets a fresh database per job. The job is built in SQL as the node daemon
would have sampled it: 8 nodes of 8 GPUs, one tick per second per node (every GPU of a node
stamped with the node's tick, the tick a few hundred microseconds late), values as NVML gives
them: whole percents and degrees, power in mW and the energy counter in mJ (as W and J), memory
in bytes. Values move slowly: utilisation near 100 % with dips, a 60 s checkpoint every 30
minutes (GPUs idle, power down), power drifting with noise, temperature creeping, memory stepping
every 10 minutes, clocks throttled now and then; PCIe throughput and the GPM ratios (H100 only:
arbitrary doubles) are noisy. The per-minute rollup is built as the ingest path builds it.

"All in" is everything each tier keeps on disk: heap, TOAST, indexes (and their free-space and
visibility maps) of the raw partitions plus the rollups (``gpu_minutes``, ``gpu_hours``), against the packed
tables (``gpu_sample_blocks``, ``gpu_sample_timelines``, the ``gpu_devices`` dictionary and the
packed rollup ``gpu_minute_blocks``, and ``gpu_hours``, which is never packed) after a compaction pass has
emptied the raw partitions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobsight.collector.store import migrate  # noqa: E402
from jobsight.collector.store.embedded_db import EmbeddedPostgres  # noqa: E402
from jobsight.collector.store.partitions import PartitionKeeper  # noqa: E402
from jobsight.collector.tiers import compaction  # noqa: E402
from jobsight.collector.tiers.rollup import rebuild_minutes  # noqa: E402

START = dt.datetime(2024, 6, 3, tzinfo=dt.UTC)
JOB, CLUSTER = "8675309", "default"
SITE_SAMPLES_PER_DAY = 500 * 8 * 86400
"""A 500-node, 8-GPU site sampled at 1 Hz."""

# One tick per node per second; the GPUs of a node share it. ``busy`` is false during the
# checkpoint that opens every half hour. random() is seeded, so every run builds the same job.
GENERATE = """
INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, util_gpu, util_mem, mem_used,
                         mem_total, power_w, energy_j, temp_c, sm_clock_mhz, mem_clock_mhz, pcie_tx_kbs, pcie_rx_kbs,
                         throttle_reasons, ecc_errors, process_count, sm_active, tensor_active, lost)
SELECT %(cluster)s, %(job)s, ts, node, gpu, uuid, 'NVIDIA H100 80GB HBM3', util,
       CASE WHEN busy THEN 35 + floor(random() * 15) ELSE 0 END,
       71303168000 + (gpu * 3 + (t / 600) %% 3) * 2097152, 85520809984,
       power_mw / 1000.0, (energy0 + sum(power_mw) OVER per_gpu) / 1000.0,
       CASE WHEN busy THEN 62 + round(3 * sin(t / 600.0 + gpu)) + (random() < 0.1)::int ELSE 45 END,
       clock, 2619,
       floor(random() * 50000)::int + CASE WHEN busy THEN 10000 ELSE 0 END,
       CASE WHEN busy THEN 100000 + floor(random() * 400000)::int ELSE floor(random() * 1000)::int END,
       CASE WHEN clock = 1755 THEN 4 ELSE 0 END, 0, 1,
       CASE WHEN %(gpm)s THEN CASE WHEN busy THEN 70 + 20 * random() ELSE 2 * random() END END,
       CASE WHEN %(gpm)s THEN CASE WHEN busy THEN 40 + 20 * random() ELSE 0 END END, false
FROM (
    SELECT node, gpu, t, ts, busy, uuid, energy0,
           CASE WHEN busy THEN CASE WHEN random() < 0.75 THEN 100 ELSE 90 + floor(random() * 10) END
                ELSE floor(random() * 5) END AS util,
           CASE WHEN busy THEN 620000 + round(60000 * sin(t / 37.0 + gpu))::int + floor(random() * 20000)::int
                ELSE 110000 + floor(random() * 5000)::int END AS power_mw,
           CASE WHEN busy AND random() < 0.05 THEN 1755 ELSE 1980 END AS clock
    FROM (SELECT 'gpu-node-' || lpad(n::text, 3, '0') AS node, n, t,
                 %(start)s + make_interval(secs => t) + floor(random() * 2000)::int * interval '1 microsecond' AS ts,
                 (t %% 1800) >= 60 AS busy
          FROM generate_series(0, %(nodes)s - 1) n, generate_series(0, %(ticks)s - 1) t) tick,
         LATERAL (SELECT i::int2 AS gpu, 'GPU-' || md5((n * 8 + i)::text)::uuid::text AS uuid,
                         (1e9 + (n * 8 + i) * 1e7)::bigint AS energy0
                  FROM generate_series(0, %(per_node)s - 1) i) device
) x
WINDOW per_gpu AS (PARTITION BY node, gpu ORDER BY t)
"""

# One host sample per node and tick, as the node daemon reads the job's cgroup: CPU percent of
# one core (one decimal), cumulative CPU seconds, memory in bytes stepping now and then.
HOST_GENERATE = """
INSERT INTO host_samples (cluster, job_id, ts, node, cpu_util, cpu_time_s, mem_used, mem_limit)
SELECT %(cluster)s, %(job)s, ts, node, util, sum(util) OVER per_node / 100.0, mem, 1099511627776
FROM (
    SELECT 'gpu-node-' || lpad(n::text, 3, '0') AS node, t,
           %(start)s + make_interval(secs => t) + floor(random() * 2000)::int * interval '1 microsecond' AS ts,
           CASE WHEN (t %% 1800) >= 60 THEN round((700 + random() * 200)::numeric, 1)::float8
                ELSE round((100 + random() * 50)::numeric, 1)::float8 END AS util,
           322122547200 + ((t / 600) %% 5)::bigint * 1073741824 + floor(random() * 4096)::bigint * 4096 AS mem
    FROM generate_series(0, %(nodes)s - 1) n, generate_series(0, %(ticks)s - 1) t
) x
WINDOW per_node AS (PARTITION BY node ORDER BY t)
"""

# Sizes of every relation of a table (its partitions, their TOAST tables and all indexes).
SIZES = """
SELECT coalesce(sum(pg_relation_size(c.oid, fork)), 0) AS heap,
       coalesce(sum(pg_total_relation_size(c.reltoastrelid)) FILTER (WHERE fork = 'main'), 0) AS toast,
       coalesce(sum(pg_indexes_size(c.oid)) FILTER (WHERE fork = 'main'), 0) AS indexes
FROM pg_class c CROSS JOIN unnest(ARRAY['main', 'fsm', 'vm']) fork
WHERE c.oid = %(table)s::regclass OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %(table)s::regclass)
"""


def sizes(conn: psycopg.Connection[Any], tables: tuple[str, ...]) -> dict[str, int]:
    total = {"heap": 0, "toast": 0, "indexes": 0}
    for table in tables:
        row = conn.execute(SIZES, {"table": table}).fetchone()
        assert row is not None
        for key in total:
            total[key] += int(row[key])
    return total


def build(conn: psycopg.Connection[Any], gpus: int, hours: float, gpm: bool) -> int:
    keeper = PartitionKeeper()
    end = START + dt.timedelta(hours=hours)
    days = [START.date() + dt.timedelta(days=n) for n in range((end - START).days + 1)]
    for table in ("gpu_samples", "gpu_minutes", "host_samples"):
        keeper.ensure(conn, table, days)
    conn.execute("SELECT setseed(0.42)")
    shape = {"cluster": CLUSTER, "job": JOB, "start": START, "nodes": gpus // 8, "ticks": int(hours * 3600)}
    conn.execute(GENERATE, {**shape, "per_node": 8, "gpm": gpm})
    conn.execute(HOST_GENERATE, shape)
    rebuild_minutes(conn, CLUSTER, JOB)  # the rollup, as the ingest path keeps it
    row = conn.execute("SELECT count(*) AS n FROM gpu_samples").fetchone()
    return int(row["n"]) if row else 0


def line(tier: str, parts: dict[str, int], samples: int) -> str:
    total = sum(parts.values())
    cells = " ".join(f"{parts[k] / samples:>9.2f}" for k in ("heap", "toast", "indexes", "dictionary", "rollup"))
    return f"{tier:<8}{cells} {total / samples:>9.2f} {total / 2**20:>9.1f}"


def column_bytes(conn: psycopg.Connection[Any], samples: int) -> str:
    """What each packed column holds per sample (compressed, before TOAST's chunking)."""
    names = [r["attname"] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'gpu_sample_blocks'::regclass AND attnum > 0"
        " AND NOT attisdropped AND attndims > 0 ORDER BY attnum").fetchall()]
    totals = conn.execute(
        f"SELECT {', '.join(f'coalesce(sum(pg_column_size({n})), 0) AS {n}' for n in names)} FROM gpu_sample_blocks"
    ).fetchone()
    timeline = conn.execute("SELECT sum(pg_column_size(sample_ts)) AS n FROM gpu_sample_timelines").fetchone()
    assert totals is not None and timeline is not None
    used = [(n, int(totals[n])) for n in names if totals[n]]
    return "  ".join(f"{n} {b / samples:.2f}" for n, b in [("sample_ts", int(timeline["n"])), *used])


def bench(server: EmbeddedPostgres, gpus: int, hours: float, gpm: bool) -> None:
    name = f"storage_{int(time.time())}"
    admin = server.url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.url.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        began = time.monotonic()
        samples = build(conn, gpus, hours, gpm)
        built = time.monotonic() - began
        conn.execute("VACUUM ANALYZE")
        raw = {**sizes(conn, ("gpu_samples",)), "dictionary": 0,
               "rollup": sum(sizes(conn, ("gpu_minutes", "gpu_hours")).values())}
        hosts_row = conn.execute("SELECT count(*) AS n FROM host_samples").fetchone()
        hosts = int(hosts_row["n"]) if hosts_row else 0
        raw_host = sum(sizes(conn, ("host_samples",)).values())
        began = time.monotonic()
        compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)
        packed_in = time.monotonic() - began
        conn.execute("VACUUM ANALYZE")
        packed = {**sizes(conn, ("gpu_sample_blocks", "gpu_sample_timelines", "gpu_samples")),
                  "dictionary": sum(sizes(conn, ("gpu_devices",)).values()),
                  "rollup": sum(sizes(conn, ("gpu_minute_blocks", "gpu_minutes", "gpu_hours")).values())}
        columns = column_bytes(conn, samples)
        packed_host = sum(sizes(conn, ("host_sample_blocks", "host_samples")).values())
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    kind = "H100, with GPM" if gpm else "A100, no GPM"
    print(f"\n{gpus} GPUs x {hours:g} h at 1 Hz ({kind}): {samples:,} samples, built in {built:.0f} s, "
          f"packed in {packed_in:.1f} s ({samples / packed_in:,.0f} samples/s)")
    print(f"{'tier':<8}{'table':>9} {'TOAST':>9} {'indexes':>9} {'dict':>9} {'rollup':>9} {'B/sample':>9} {'MiB':>9}")
    print(line("raw", raw, samples))
    print(line("packed", packed, samples))
    raw_b, packed_b = sum(raw.values()) / samples, sum(packed.values()) / samples
    print(f"packed / raw: 1 / {raw_b / packed_b:.1f}; a 500-node x 8-GPU site at 1 Hz: "
          f"{raw_b * SITE_SAMPLES_PER_DAY / 1e9:,.0f} GB a day raw, {packed_b * SITE_SAMPLES_PER_DAY / 1e9:,.1f} GB "
          f"packed ({packed_b * SITE_SAMPLES_PER_DAY * 180 / 1e12:,.2f} TB for 180 days)")
    print(f"packed columns, B/sample before TOAST chunking: {columns}")
    print(f"host samples ({hosts:,}, one per node and tick): raw {raw_host / hosts:.1f} B/sample, "
          f"packed {packed_host / hosts:.1f} B/sample, all in")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=64, help="GPUs, 8 per node (default 64)")
    parser.add_argument("--hours", type=float, default=6.0, help="hours sampled at 1 Hz (default 6)")
    parser.add_argument("--gpm", choices=("both", "yes", "no"), default="both",
                        help="GPU with GPM (H100: sm_active, tensor_active) or without (default both)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobsight-bench-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pg")
        server.start()
        try:
            for gpm in {"both": (True, False), "yes": (True,), "no": (False,)}[args.gpm]:
                bench(server, args.gpus, args.hours, gpm)
        finally:
            server.destroy()


if __name__ == "__main__":
    main()
