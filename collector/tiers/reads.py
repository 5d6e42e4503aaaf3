"""GPU samples and GPU minutes read from both tiers as one relation.

The hot tier is the row-per-sample tables (``gpu_samples``, ``gpu_minutes``); the packed tier
is what the compaction pass made of closed hours (``gpu_sample_blocks`` with its timelines and
``gpu_devices``, ``gpu_minute_blocks``). An hour is in one tier or the other, except that late
samples for a packed hour land in the hot tables until the next pass merges them: both are
always read, and a query over the union gives the answer it gave before compaction.

Each function returns a parenthesised ``SELECT`` to put in a ``FROM`` clause. ``job`` and
``cluster`` are SQL (a named parameter, or a column of an outer query); ``start`` and ``end``,
when given, are SQL for the inclusive bounds on ``ts``. The packed side also bounds the hour
of its blocks, so that only the days in the window are read (partitions are pruned on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from jobsight.collector.store.packed_params import BLOCK_INTERVAL
from jobsight.collector.store.schema import MINUTE_KEY, SAMPLE_COUNTS, gpu_minutes
from jobsight.collector.tiers.packed_format import ENCODINGS, unpacking
from jobsight.collector.tiers.time_planes import unpacking_times

SAMPLE_KEY: Final = ("ts", "node", "gpu_index", "gpu_uuid", "gpu_name", "mig_uuid")
"""What every row of :func:`samples` carries besides the measurements asked for."""

MINUTE_VALUES: Final = tuple(c.name for c in gpu_minutes.columns if c.name not in MINUTE_KEY)
"""The rollup's value columns (``gpu_uuid``, ``samples``, sums, counts, extremes...)."""

def _bounds(column: str, start: str | None, end: str | None) -> list[str]:
    return ([f"{column} >= {start}"] if start else []) + ([f"{column} <= {end}"] if end else [])


def _block_bounds(alias: str, start: str | None, end: str | None) -> list[str]:
    """A block of hour ``ts`` holds times in [ts, ts + 1 h)."""
    return ([f"{alias}.ts > {start} - {BLOCK_INTERVAL}"] if start else []) + ([f"{alias}.ts <= {end}"] if end else [])


def _block_parts(start: str | None, end: str | None) -> list[tuple[list[str], bool]]:
    """The packed blocks a window reads, in two parts: (conditions on the block ``b``, whether
    its rows must be filtered). Blocks wholly inside the window need no filter on their rows;
    only the (at most two) hours at its edges do. Split so, the planner, which cannot estimate
    a filter on unnested values, knows how many rows come and aggregates them in a hash
    rather than sorting them all."""
    if start is None and end is None:
        return [([], False)]
    inside = ([f"b.ts >= {start}"] if start else []) + ([f"b.ts + {BLOCK_INTERVAL} <= {end}"] if end else [])
    overlapping = _block_bounds("b", start, end)
    return [([*overlapping, *inside], False), ([*overlapping, f"NOT ({' AND '.join(inside)})"], True)]


def hot_samples(
    columns: Sequence[str],
    *,
    job: str = "%(job)s",
    cluster: str = "%(cluster)s",
    start: str | None = None,
    end: str | None = None,
) -> str:
    """The job's rows of ``gpu_samples``: :data:`SAMPLE_KEY` and ``columns``."""
    where = " AND ".join([f"job_id = {job}", f"cluster = {cluster}", *_bounds("ts", start, end)])
    return f"(SELECT {', '.join([*SAMPLE_KEY, *columns])} FROM gpu_samples WHERE {where})"


def unpack_samples(
    columns: Sequence[str],
    *,
    blocks: str = "gpu_sample_blocks",
    timelines: str = "gpu_sample_timelines",
    where: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> str:
    """Packed sample blocks as rows: ``u_ts``, the block's columns ``b_<name>`` for ``extra``
    (e.g. ``cluster``, ``device``), and ``columns`` decoded. ``blocks`` and ``timelines`` are the
    relations to read (the tables, or what a compaction just deleted from them); ``where`` are
    conditions on the block ``b`` and its timeline ``t``.

    The arrays are unnested in the select list, where set-returning functions run in lockstep
    and row by row: in FROM, each would first be copied into a tuplestore (four times slower)."""
    row, decoded = unpacking([ENCODINGS[name] for name in columns])
    times, time = unpacking_times("t")
    kept = [*(f"b.{c} AS b_{c}" for c in extra), *times, *row]
    return f"""(
        SELECT {time} AS u_ts, {", ".join([*(f"b_{c}" for c in extra), *decoded])} FROM (
            SELECT {", ".join(kept)}
            FROM {blocks} b JOIN {timelines} t ON t.job_id = b.job_id AND t.cluster = b.cluster AND t.ts = b.ts
                 AND t.timeline = b.timeline
            {"WHERE " + " AND ".join(where) if where else ""}
        ) unnested
    )"""


def packed_samples(
    columns: Sequence[str],
    *,
    job: str = "%(job)s",
    cluster: str = "%(cluster)s",
    start: str | None = None,
    end: str | None = None,
) -> str:
    """The job's packed samples, unpacked: :data:`SAMPLE_KEY` and ``columns``."""
    selected = ", ".join(["p.u_ts AS ts", *(f"d.{k}" for k in SAMPLE_KEY[1:]), *(f"p.{c}" for c in columns)])
    parts = []
    for blocks, filtered in _block_parts(start, end):
        where = [
            f"b.job_id = {job}", f"b.cluster = {cluster}", *blocks,
            # The timeline's own bounds are repeated so that its partitions are pruned too.
            *_block_bounds("t", start, end),
        ]
        rows = unpack_samples(columns, where=where, extra=("device",))
        bounds = _bounds("p.u_ts", start, end) if filtered else []
        parts.append(f"""SELECT {selected} FROM {rows} p JOIN gpu_devices d ON d.id = p.b_device
            {"WHERE " + " AND ".join(bounds) if bounds else ""}""")
    return f"({' UNION ALL '.join(parts)})"


def samples(
    columns: Sequence[str],
    *,
    job: str = "%(job)s",
    cluster: str = "%(cluster)s",
    start: str | None = None,
    end: str | None = None,
) -> str:
    """One job's GPU samples from both tiers: :data:`SAMPLE_KEY` and ``columns`` (``gpu_samples``
    measurement columns), every sample once, with the values it was stored with."""
    hot = hot_samples(columns, job=job, cluster=cluster, start=start, end=end)
    packed = packed_samples(columns, job=job, cluster=cluster, start=start, end=end)
    return f"(SELECT * FROM {hot} h UNION ALL SELECT * FROM {packed} p)"


def samples_near(
    columns: Sequence[str],
    *,
    times: str,
    near: str,
    job: str = "%(job)s",
    cluster: str = "%(cluster)s",
) -> str:
    """One job's GPU samples from both tiers within ``near`` (SQL, an interval) of any of ``times``
    (SQL, an ascending non-empty timestamptz[]): :data:`SAMPLE_KEY` and ``columns``.

    For many times at once (a job's epoch boundaries): each block of an hour those windows touch is
    unpacked once, where a read per time would unpack it again for each (a block is a GPU's whole
    hour, and a counter's is a running sum)."""
    hours = (f"ARRAY(SELECT DISTINCT h FROM unnest({times}) t, "
             f"generate_series(date_trunc('hour', t - {near}, 'UTC'), t + {near}, {BLOCK_INTERVAL}) h)")
    where = [f"b.job_id = {job}", f"b.cluster = {cluster}", f"b.ts = ANY({hours})", f"t.ts = ANY({hours})"]
    selected = ", ".join(["p.u_ts AS ts", *(f"d.{k}" for k in SAMPLE_KEY[1:]), *(f"p.{c}" for c in columns)])
    packed = f"SELECT {selected} FROM {unpack_samples(columns, where=where, extra=('device',))} p " \
             "JOIN gpu_devices d ON d.id = p.b_device"
    hot = hot_samples(columns, job=job, cluster=cluster, start=f"({times})[1] - {near}",
                      end=f"({times})[cardinality({times})] + {near}")
    # The times around a sample's: width_bucket's part p lies between times[p] and times[p + 1].
    nearby = (f"(x.part > 0 AND x.ts - ({times})[x.part] <= {near}) "
              f"OR (x.part < cardinality({times}) AND ({times})[x.part + 1] - x.ts <= {near})")
    return f"""(
        SELECT {", ".join([*SAMPLE_KEY, *columns])} FROM (
            SELECT s.*, width_bucket(s.ts, {times}) AS part FROM ({hot} UNION ALL {packed}) s
        ) x WHERE {nearby}
    )"""


def unpack_minutes(
    columns: Sequence[str] = MINUTE_VALUES,
    *,
    blocks: str = "gpu_minute_blocks",
    where: Sequence[str] = (),
) -> str:
    """Packed minute blocks as rows: ``cluster``, ``ts`` (the minute), ``node``, ``gpu_index``,
    ``mig_uuid`` and ``columns``, unnested in the select list (see :func:`unpack_samples`)."""
    counts = [c for c in columns if c in SAMPLE_COUNTS]
    arrays = list(dict.fromkeys([*columns, *(["samples"] if counts else [])]))
    unnested = ["unnest(b.minute_ts) AS ts", *(f"unnest(b.{c}) AS {c}" for c in arrays)]
    values = [f"coalesce({c}, samples) AS {c}" if c in SAMPLE_COUNTS else c for c in columns]
    return f"""(
        SELECT {", ".join(["cluster", "ts", "node", "gpu_index", "mig_uuid", *values])}
        FROM (
            SELECT {", ".join(["b.cluster", "b.node", "b.gpu_index", "b.mig_uuid", *unnested])}
            FROM {blocks} b {"WHERE " + " AND ".join(where) if where else ""}
        ) unnested
    )"""


def minutes(
    columns: Sequence[str] = MINUTE_VALUES,
    *,
    job: str = "%(job)s",
    cluster: str = "%(cluster)s",
    start: str | None = None,
    end: str | None = None,
) -> str:
    """One job's per-minute rollup rows: ``ts`` (the minute), ``node``, ``gpu_index``,
    ``mig_uuid`` (``''`` for none, as in ``gpu_minutes``) and ``columns``. A minute that got
    late samples after its day was packed has a row in each tier: sums and extremes add up."""
    hot = " AND ".join([f"job_id = {job}", f"cluster = {cluster}", *_bounds("ts", start, end)])
    selected = ", ".join(["ts", "node", "gpu_index", "mig_uuid", *columns])
    parts = [f"SELECT {selected} FROM gpu_minutes WHERE {hot}"]
    for blocks, filtered in _block_parts(start, end):
        packed = unpack_minutes(columns, where=[f"b.job_id = {job}", f"b.cluster = {cluster}", *blocks])
        bounds = _bounds("m.ts", start, end) if filtered else []
        parts.append(f"SELECT {selected} FROM {packed} m {'WHERE ' + ' AND '.join(bounds) if bounds else ''}")
    return f"({' UNION ALL '.join(parts)})"


def gpu_minutes_of(
    columns: Sequence[str] = MINUTE_VALUES,
    *,
    job: str,
    cluster: str,
    node: str,
    gpu_index: str,
    mig_uuid: str,
    start: str | None = None,
    end: str | None = None,
) -> str:
    """One GPU's per-minute rollup rows from both tiers: ``ts`` (the minute) and ``columns``, as
    :func:`minutes` gives them for the job, less the other GPUs. Every argument is SQL, so that it
    can sit in a ``LATERAL`` per GPU (the outer query's columns): the hot side is then a range of the
    rollup's key index, and the packed side the GPU's blocks of the hours the window touches only
    (one block a GPU-hour), so a window over the last hour unpacks at most two blocks a GPU."""
    gpu = [f"node = {node}", f"gpu_index = {gpu_index}", f"mig_uuid = {mig_uuid}"]
    hot = " AND ".join([f"job_id = {job}", f"cluster = {cluster}", *gpu, *_bounds("ts", start, end)])
    selected = ", ".join(["ts", *columns])
    parts = [f"SELECT {selected} FROM gpu_minutes WHERE {hot}"]
    for blocks, filtered in _block_parts(start, end):
        where = [f"b.job_id = {job}", f"b.cluster = {cluster}", *(f"b.{c}" for c in gpu), *blocks]
        bounds = _bounds("m.ts", start, end) if filtered else []
        parts.append(f"SELECT {selected} FROM {unpack_minutes(columns, where=where)} m "
                     f"{'WHERE ' + ' AND '.join(bounds) if bounds else ''}")
    return f"({' UNION ALL '.join(parts)})"


def sample_range(hot: str, packed: str) -> str:
    """First and last sample of a job (``%(job)s``, ``%(cluster)s``) over both tiers: the ``hot``
    table's rows and the ``packed`` table's blocks, which keep their first and last times, so
    none is unpacked."""
    return f"""
SELECT min(first) AS start, max(last) AS end FROM (
    SELECT min(ts) AS first, max(ts) AS last FROM {hot} WHERE job_id = %(job)s AND cluster = %(cluster)s
    UNION ALL
    SELECT min(first_ts), max(last_ts) FROM {packed} WHERE job_id = %(job)s AND cluster = %(cluster)s
) r
"""


SAMPLE_RANGE: Final = sample_range("gpu_samples", "gpu_sample_blocks")
"""First and last GPU sample of a job over both tiers."""


def latest_samples(columns: Sequence[str]) -> str:
    """The job's latest ``%(limit)s`` samples, newest first: ``columns``.

    Blocks cover disjoint hours, so the latest ``limit`` packed samples are in the newest hours
    whose blocks hold ``limit`` samples between them; only those are unpacked."""
    return f"""
WITH hours AS (
    SELECT ts, sum(sum(samples)) OVER (ORDER BY ts DESC) AS newer_or_same
    FROM gpu_sample_blocks WHERE job_id = %(job)s AND cluster = %(cluster)s GROUP BY ts
), oldest_needed AS (
    SELECT coalesce(max(ts) FILTER (WHERE newer_or_same >= %(limit)s), '-infinity') AS ts FROM hours
)
SELECT {", ".join(columns)} FROM (
    (SELECT ts, {", ".join(columns)} FROM gpu_samples WHERE job_id = %(job)s AND cluster = %(cluster)s
     ORDER BY ts DESC LIMIT %(limit)s)
    UNION ALL
    SELECT ts, {", ".join(columns)} FROM {packed_samples(columns, start="(SELECT ts FROM oldest_needed)")} p
) s
ORDER BY ts DESC LIMIT %(limit)s
"""
