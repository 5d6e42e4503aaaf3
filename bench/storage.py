"""Bytes per GPU sample (and per host sample), all in, for the raw tier and the packed tier of the same job;
the WAL each phase writes; and the whole database at steady state for a site's settings.

    python bench/storage.py                  # 64 GPUs x 6 h at 1 Hz, with and without GPM
    python bench/storage.py --hours 1        # a quick look
    python bench/storage.py --retention-days 180 --hot-minutes 30 --compact-interval-s 600

An embedded PostgreSQL gets a fresh database per job. The job is built in SQL as the node daemon
would have sampled it: 8 nodes of 8 GPUs, one tick per second per node (every GPU of a node
stamped with the node's tick, the tick a few hundred microseconds late), values as the daemon
sends NVML's (``jobsight.agent.node.gpu.precision``): whole percents and degrees, memory in bytes,
power to 0.1 W, the energy counter (which integrates the sensor's mW) in whole J, PCIe throughput
in whole MB/s and the GPM ratios to a tenth of a point. Values move slowly: utilisation near 100 %
with dips, a 60 s checkpoint every 30 minutes (GPUs idle, power down), power drifting with noise,
temperature creeping, memory stepping every 10 minutes, clocks throttled now and then; PCIe
throughput and the GPM ratios (H100 only) are noisy. The per-minute rollup is built as the ingest path builds it.

"All in" is everything each tier keeps on disk: heap, TOAST, indexes (and their free-space and
visibility maps) of the raw partitions plus the rollups (``gpu_minutes``, ``gpu_hours``), against the packed
tables (``gpu_sample_blocks``, ``gpu_sample_timelines``, the ``gpu_devices`` dictionary and the
packed rollup ``gpu_minute_blocks``, and ``gpu_hours``, which is never packed) after a compaction pass has
emptied the raw partitions.

WAL. ``pg_current_wal_lsn()`` is read before and after each phase (``pg_wal_lsn_diff``): the GPU
raw inserts, the host raw inserts, the minute rollup build, a VACUUM of the raw tier, the
compaction pass (packing and emptying), a VACUUM after it; the total is their sum, printed per
GPU sample with the host samples' WAL folded in (the pass packs both kinds in one transaction,
so its WAL cannot be split). pg_walinspect reads each phase's records back for the share that
is full-page images. The total is CHECKPOINT-free: the bench forces none, and the server is
started so that none falls in a run (``checkpoint_timeout`` 1 d, ``max_wal_size`` 64 GB; at the
defaults one would begin during a 6 h job's inserts, and the images of every page touched after
it would make the figure hang on where it fell); everything else, full_page_writes and checksums
included, is the server's default (printed). A site, though, checkpoints every few minutes, within each raw
page's life, and with data checksums (PostgreSQL 18's default) the first hint bits set on a
page after a checkpoint log it whole: the bench adds that as one image per raw heap page (a run
with a CHECKPOINT after the inserts measured it so), a floor, printed beside the measured total.
Autovacuum is off so that its WAL does not land in whichever phase it ran beside; the two
VACUUMs stand where it would run. Where the bench differs from a site: the real ingest path
writes samples with COPY/INSERT in batches, the bench with one INSERT..SELECT, so heap WAL per
row is alike but not identical (one heap record per row here, multi-row records for COPY; index
records alike); and the ingest path upserts the open minute's rollup row at each group commit
that carries it, where the bench writes each minute once, so its rollup WAL is a floor.

Steady state (:mod:`bench.storage_model`). A site's database holds at most one open hour, the
hot minutes (``--hot-minutes``, ``JOBSIGHT_HOT_MINUTES``) and one pass interval
(``--compact-interval-s``, ``JOBSIGHT_COMPACT_INTERVAL_S``) of raw rows, its raw window, and packed
blocks for the rest of the retention (``--retention-days``); with both tiers' rollups, the host
samples of both tiers, and the ``gpu_devices`` dictionary, which holds each GPU once. From this
run's sizes per GPU sample (host bytes divided by GPU samples)::

    B/sample = (raw_B * raw_window_s + packed_B * (retention_s - raw_window_s)) / retention_s

printed with each term's share. The raw window is the worst case, and every partition's fixed
pages (maps, index roots) are spread over this small job's samples, not a site's: both err high.
WAL is printed apart from it: it is recycled after checkpoints, so it is not disk the database
keeps at steady state, but every byte is written (and shipped to replicas and archives). Then
the two targets: packed tier <= 8 B/GPU sample, whole database <= 16 B/GPU sample, met or not
(printed, never an exit status).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.storage_entropy import entropy_floor  # noqa: E402
from bench.storage_model import SITE_SAMPLES_PER_DAY, Measured, Settings, report  # noqa: E402
from jobsight.collector.store import migrate  # noqa: E402
from jobsight.collector.store.embedded_db import EmbeddedPostgres  # noqa: E402
from jobsight.collector.store.packed_params import TIME_PLANES  # noqa: E402
from jobsight.collector.store.partitions import PartitionKeeper  # noqa: E402
from jobsight.collector.tiers import compaction  # noqa: E402
from jobsight.collector.tiers.rollup import rebuild_minutes  # noqa: E402

START = dt.datetime(2024, 6, 3, tzinfo=dt.UTC)
JOB, CLUSTER = "8675309", "default"

# One tick per node per second; the GPUs of a node share it. ``busy`` is false during the
# checkpoint that opens every half hour. random() is seeded, so every run builds the same job.
GENERATE = """
INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, util_gpu, util_mem, mem_used,
                         mem_total, power_w, energy_j, temp_c, sm_clock_mhz, mem_clock_mhz, pcie_tx_kbs, pcie_rx_kbs,
                         throttle_reasons, ecc_errors, process_count, sm_active, tensor_active, lost)
SELECT %(cluster)s, %(job)s, ts, node, gpu, uuid, 'NVIDIA H100 80GB HBM3', util,
       CASE WHEN busy THEN 35 + floor(random() * 15) ELSE 0 END,
       71303168000 + (gpu * 3 + (t / 600) %% 3) * 2097152, 85520809984,
       round(power_mw / 100.0) / 10, round((energy0 + sum(power_mw) OVER per_gpu) / 1000.0),
       CASE WHEN busy THEN 62 + round(3 * sin(t / 600.0 + gpu)) + (random() < 0.1)::int ELSE 45 END,
       clock, 2619,
       round((floor(random() * 50000)::int + CASE WHEN busy THEN 10000 ELSE 0 END) / 1000.0)::int * 1000,
       round(CASE WHEN busy THEN 100000 + floor(random() * 400000)::int ELSE floor(random() * 1000)::int END
             / 1000.0)::int * 1000,
       CASE WHEN clock = 1755 THEN 4 ELSE 0 END, 0, 1,
       CASE WHEN %(gpm)s THEN round(CASE WHEN busy THEN 70 + 20 * random() ELSE 2 * random() END::numeric, 1) END,
       CASE WHEN %(gpm)s THEN round(CASE WHEN busy THEN 40 + 20 * random() ELSE 0 END::numeric, 1) END, false
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
# one core (one decimal), cumulative CPU seconds (the cgroup's whole microseconds), memory in
# bytes stepping now and then.
HOST_GENERATE = """
INSERT INTO host_samples (cluster, job_id, ts, node, cpu_util, cpu_time_s, mem_used, mem_limit)
SELECT %(cluster)s, %(job)s, ts, node, util, round(sum(util) OVER per_node * 10000)::int8 / 1e6, mem, 1099511627776
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


# WAL since a mark, from one reading of the position (two could straddle another backend's
# write), and how much of it is full-page images (pg_walinspect reads the records back).
WAL_SINCE = """
SELECT lsn::text AS lsn, pg_wal_lsn_diff(lsn, %(mark)s::pg_lsn)::bigint AS written,
       (SELECT coalesce(sum(fpi_size), 0) FROM pg_get_wal_stats(%(mark)s::pg_lsn, lsn))::bigint AS images
FROM (SELECT pg_current_wal_lsn() AS lsn) now
"""
# The settings that decide how much WAL a row costs: full-page images after each checkpoint
# (more of them with checksums, which WAL-log hint bits too), and whether they are compressed.
WAL_SETTINGS = ("full_page_writes", "wal_compression", "data_checksums", "checkpoint_timeout", "max_wal_size")
REDO = "SELECT redo_lsn::text AS lsn FROM pg_control_checkpoint()"
SERVER_SETTINGS = ("autovacuum=off", "checkpoint_timeout=1d", "max_wal_size=64GB")
"""No autovacuum: its WAL would land in whichever phase it ran beside (the bench vacuums where it
would, as phases of their own). No checkpoint in a run: one would begin partway (at the default
max_wal_size, during the inserts of a 6 h job) and log whole every page touched after it, a
figure that would hang on where it fell. Everything else, full_page_writes included, as the
server has it."""


@dataclass
class WalMeter:
    """WAL written per phase: ``pg_current_wal_lsn()`` before and after each, nothing forced
    in between (no CHECKPOINT), and the full-page images among it. The server is the bench's alone."""

    conn: psycopg.Connection[Any]
    phases: dict[str, int] = field(default_factory=dict)
    images: dict[str, int] = field(default_factory=dict)
    """Full-page images' bytes, per phase."""
    mark: str = ""
    settings: str = ""
    checksums: bool = False
    """Data checksums on: the first hint bit set on a page after a checkpoint logs the page whole."""
    redo: str = ""
    """The last checkpoint's redo point when the meter started."""

    def _one(self, query: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        row = self.conn.execute(query, params).fetchone()
        assert row is not None
        return dict(row)

    def start(self) -> None:
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        setting = "SELECT current_setting(%(name)s) AS v"
        self.settings = ", ".join(f"{name} {self._one(setting, {'name': name})['v']}" for name in WAL_SETTINGS)
        self.checksums = self._one(setting, {"name": "data_checksums"})["v"] == "on"
        self.redo = str(self._one(REDO)["lsn"])
        self.mark = str(self._one("SELECT pg_current_wal_lsn()::text AS lsn")["lsn"])

    def checkpointed(self) -> bool:
        """Whether a checkpoint completed since ``start`` (one still under way shows as images)."""
        return str(self._one(REDO)["lsn"]) != self.redo

    def phase(self, name: str) -> None:
        row = self._one(WAL_SINCE, {"mark": self.mark})
        self.phases[name], self.images[name], self.mark = int(row["written"]), int(row["images"]), str(row["lsn"])

    def skip(self) -> None:
        """Leave out what was written since the last phase."""
        self.mark = str(self._one("SELECT pg_current_wal_lsn()::text AS lsn")["lsn"])

    @property
    def total(self) -> int:
        return sum(self.phases.values())


@dataclass
class Run:
    """What one job's bench measured: counts, sizes (bytes) by tier, times and WAL."""

    gpus: int
    hours: float
    gpm: bool
    wal: WalMeter
    samples: int = 0
    hosts: int = 0
    built: float = 0.0
    packed_in: float = 0.0
    raw: dict[str, int] = field(default_factory=dict)
    packed: dict[str, int] = field(default_factory=dict)
    raw_host: int = 0
    raw_host_heap: int = 0
    packed_host: int = 0
    columns: str = ""
    checkpointed: bool = False
    entropy: float = 0.0
    """What the values carry, B/GPU sample (bench/storage_entropy.py)."""
    entropy_columns: dict[str, float] = field(default_factory=dict)


def build(conn: psycopg.Connection[Any], gpus: int, hours: float, gpm: bool, wal: WalMeter) -> int:
    keeper = PartitionKeeper()
    end = START + dt.timedelta(hours=hours)
    days = [START.date() + dt.timedelta(days=n) for n in range((end - START).days + 1)]
    for table in ("gpu_samples", "gpu_minutes", "host_samples"):
        keeper.ensure(conn, table, days)
    conn.execute("SELECT setseed(0.42)")
    wal.start()  # after the partitions: a site makes them once a day, not per sample
    shape = {"cluster": CLUSTER, "job": JOB, "start": START, "nodes": gpus // 8, "ticks": int(hours * 3600)}
    conn.execute(GENERATE, {**shape, "per_node": 8, "gpm": gpm})
    wal.phase("GPU raw inserts")
    conn.execute(HOST_GENERATE, shape)
    wal.phase("host raw inserts")
    rebuild_minutes(conn, CLUSTER, JOB)  # the rollup, as the ingest path keeps it
    wal.phase("minute rollup")
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
    times = " + ".join(f"coalesce(pg_column_size({c}), 0)" for c in ("sample_ts", *TIME_PLANES))
    timeline = conn.execute(f"SELECT sum({times}) AS n FROM gpu_sample_timelines").fetchone()
    assert totals is not None and timeline is not None
    # A column's byte planes (<name>_p0, _p1...) are summed, with how many were stored.
    by_column: dict[str, list[int]] = {"sample_ts": [int(timeline["n"]), 0]}
    for name in names:
        if totals[name]:
            plane = re.fullmatch(r"(.+)_p\d", name)
            kept = by_column.setdefault(plane.group(1) if plane else name, [0, 0])
            kept[0] += int(totals[name])
            kept[1] += plane is not None
    def shown(name: str, size: int, planes: int) -> str:
        return f"{name} {size / samples:.2f}" + (f" ({planes} plane{'s' if planes > 1 else ''})" if planes else "")

    return "  ".join(shown(n, b, planes) for n, (b, planes) in by_column.items())


def count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()
    return int(row["n"]) if row else 0


def measure_raw(conn: psycopg.Connection[Any], run: Run) -> None:
    """The raw tier as the pass finds it: vacuumed (autovacuum would have), rollups built."""
    conn.execute("VACUUM ANALYZE")
    run.wal.phase("vacuum, raw")
    run.raw = {**sizes(conn, ("gpu_samples",)), "dictionary": 0,
               "rollup": sum(sizes(conn, ("gpu_minutes", "gpu_hours")).values())}
    run.hosts = count(conn, "host_samples")
    host = sizes(conn, ("host_samples",))
    run.raw_host, run.raw_host_heap = sum(host.values()), host["heap"]
    run.entropy, run.entropy_columns = entropy_floor(conn)
    run.wal.skip()  # the estimate's temporary tables are nobody's WAL


def measure_packed(conn: psycopg.Connection[Any], run: Run) -> None:
    """One compaction pass over the whole job, then the packed tier (and the emptied raw one)."""
    began = time.monotonic()
    compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)
    run.packed_in = time.monotonic() - began
    run.wal.phase("compaction pass")
    conn.execute("VACUUM ANALYZE")
    run.wal.phase("vacuum, packed")
    run.checkpointed = run.wal.checkpointed()
    run.packed = {**sizes(conn, ("gpu_sample_blocks", "gpu_sample_timelines", "gpu_samples")),
                  "dictionary": sum(sizes(conn, ("gpu_devices",)).values()),
                  "rollup": sum(sizes(conn, ("gpu_minute_blocks", "gpu_minutes", "gpu_hours")).values())}
    run.columns = column_bytes(conn, run.samples)
    run.packed_host = sum(sizes(conn, ("host_sample_blocks", "host_samples")).values())


def measure(url: str, gpus: int, hours: float, gpm: bool) -> Run:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        run = Run(gpus=gpus, hours=hours, gpm=gpm, wal=WalMeter(conn))
        began = time.monotonic()
        run.samples = build(conn, gpus, hours, gpm, run.wal)
        run.built = time.monotonic() - began
        measure_raw(conn, run)
        measure_packed(conn, run)
    return run


def print_tiers(run: Run) -> None:
    """The raw and packed tiers of the job, side by side."""
    samples = run.samples
    kind = "H100, with GPM" if run.gpm else "A100, no GPM"
    print(f"\n{run.gpus} GPUs x {run.hours:g} h at 1 Hz ({kind}): {samples:,} samples, built in {run.built:.0f} s, "
          f"packed in {run.packed_in:.1f} s ({samples / run.packed_in:,.0f} samples/s)")
    print(f"{'tier':<8}{'table':>9} {'TOAST':>9} {'indexes':>9} {'dict':>9} {'rollup':>9} {'B/sample':>9} {'MiB':>9}")
    print(line("raw", run.raw, samples))
    print(line("packed", run.packed, samples))
    raw_b, packed_b = sum(run.raw.values()) / samples, sum(run.packed.values()) / samples
    print(f"packed / raw: 1 / {raw_b / packed_b:.1f}; a 500-node x 8-GPU site at 1 Hz: "
          f"{raw_b * SITE_SAMPLES_PER_DAY / 1e9:,.0f} GB a day raw, {packed_b * SITE_SAMPLES_PER_DAY / 1e9:,.1f} GB "
          f"packed ({packed_b * SITE_SAMPLES_PER_DAY * 180 / 1e12:,.2f} TB for 180 days)")
    print(f"packed columns, B/sample before TOAST chunking: {run.columns}")
    carried = "  ".join(f"{name} {size:.2f}" for name, size in run.entropy_columns.items() if size >= 0.005)
    print(f"what the values carry (order-0 entropy of each column or its differences, at the precision kept): "
          f"{run.entropy:.2f} B/sample: {carried}")
    print(f"host samples ({run.hosts:,}, one per node and tick): raw {run.raw_host / run.hosts:.1f} B/sample, "
          f"packed {run.packed_host / run.hosts:.1f} B/sample, all in; their raw inserts wrote "
          f"{run.wal.phases['host raw inserts'] / run.hosts:.0f} B/host sample of WAL")


def print_wal(run: Run) -> None:
    """WAL per GPU sample, phase by phase, and the full-page images among it; host samples' WAL
    is folded into the total."""
    wal = run.wal
    phases = {**wal.phases, "total": wal.total}
    images = {**wal.images, "total": sum(wal.images.values())}
    width = max(len(name) for name in phases) + 2
    print("WAL written, B/GPU sample (host samples' inserts and packing folded in):")
    print(f"{'':<8}" + "".join(f"{name:>{width}}" for name in phases))
    print(f"{'all':<8}" + "".join(f"{written / run.samples:>{width}.1f}" for written in phases.values()))
    print(f"{'images':<8}" + "".join(f"{written / run.samples:>{width}.1f}" for written in images.values()))
    checkpoint = "a checkpoint in the run" if run.checkpointed else "no checkpoint in the run"
    print(f"WAL: {wal.total / 2**20:,.1f} MiB in all, {checkpoint}; {wal.settings}")
    if wal.checksums:
        print(f"a site's checkpoints (every few minutes) fall within each raw page's life; with data checksums the "
              f"first hint bits set on a page after one log it whole: at least +{site_images(run):.0f} B/GPU sample "
              "(one image per raw heap page, GPU and host)")


def site_images(run: Run) -> float:
    """The full-page images a site's checkpoints add, per GPU sample: one per raw heap page at
    least (measured once with a CHECKPOINT after the inserts: the images matched the raw heap)."""
    return (run.raw["heap"] + run.raw_host_heap) / run.samples if run.wal.checksums else 0.0


def model_inputs(run: Run) -> Measured:
    """The run's sizes per GPU sample, split the way the steady-state model weighs them."""
    per = float(run.samples)
    samples_only = ("heap", "toast", "indexes")
    return Measured(
        raw_samples=sum(run.raw[k] for k in samples_only) / per,
        raw_rollup=run.raw["rollup"] / per,
        packed_samples=sum(run.packed[k] for k in samples_only) / per,
        packed_rollup=run.packed["rollup"] / per,
        raw_host=run.raw_host / per,
        packed_host=run.packed_host / per,
        dictionary_per_gpu=run.packed["dictionary"] / run.gpus,
        wal=run.wal.total / per,
        wal_images=site_images(run),
        packed_tier=sum(run.packed.values()) / per,
    )


def bench(server: EmbeddedPostgres, gpus: int, hours: float, gpm: bool, settings: Settings) -> None:
    name = f"storage_{int(time.time())}"
    admin = server.url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.url.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)
    run = measure(url, gpus, hours, gpm)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    print_tiers(run)
    print_wal(run)
    for text in report(model_inputs(run), settings):
        print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=64, help="GPUs, 8 per node (default 64)")
    parser.add_argument("--hours", type=float, default=6.0, help="hours sampled at 1 Hz (default 6)")
    parser.add_argument("--gpm", choices=("both", "yes", "no"), default="both",
                        help="GPU with GPM (H100: sm_active, tensor_active) or without (default both)")
    parser.add_argument("--retention-days", type=int, default=90,
                        help="days the packed tier is kept, for the steady-state figure (default 90)")
    parser.add_argument("--hot-minutes", type=int, default=15,
                        help="JOBSIGHT_HOT_MINUTES: minutes a closed hour stays raw (default 15)")
    parser.add_argument("--compact-interval-s", type=int, default=300,
                        help="JOBSIGHT_COMPACT_INTERVAL_S: seconds between passes (default 300)")
    args = parser.parse_args()
    if args.retention_days < 1 or args.hot_minutes < 0 or args.compact_interval_s < 0:
        parser.error("--retention-days must be at least 1, --hot-minutes and --compact-interval-s at least 0")
    settings = Settings(args.retention_days, args.hot_minutes, args.compact_interval_s)
    with tempfile.TemporaryDirectory(prefix="jobsight-bench-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pg", server_settings=SERVER_SETTINGS)
        server.start()
        try:
            for gpm in {"both": (True, False), "yes": (True,), "no": (False,)}[args.gpm]:
                bench(server, args.gpus, args.hours, gpm, settings)
        finally:
            server.destroy()


if __name__ == "__main__":
    main()
