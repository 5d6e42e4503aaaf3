"""Host samples in their two tiers: the reader of both, and how the compaction pass packs an hour.

The hot tier is ``host_samples``, a row per node and tick; the packed tier is
``host_sample_blocks``, a row per job, node and UTC hour with the sample times and each
measurement in the same order: the CPU and memory columns in byte planes, as a GPU block's
(``docs/format/packed.md``), the rest as arrays; every value reads back as it
was stored. An hour is in one tier or the other, but
late samples for a packed hour land in ``host_samples`` until the next pass merges them: both
are always read. The SQL conventions are :mod:`jobsight.collector.tiers.reads`'.
"""

from __future__ import annotations

from typing import Final

from jobsight.collector.store.packed_params import BLOCK_INTERVAL
from jobsight.collector.tiers.packed_format import (
    HOST,
    HOST_ENCODINGS,
    HOST_VALUES,
    pack_aggregates,
    pack_columns,
    pack_integers,
    pack_window,
    unpacking,
)
from jobsight.collector.tiers.reads import sample_range
from jobsight.collector.tiers.time_planes import offsets, packed_times, unpacking_times

__all__ = ["HOST_VALUES", "PACK_HOUR", "RANGE", "samples"]

def _unpack(blocks: str, where: str) -> str:
    """Host blocks as rows: ``cluster``, ``ts``, ``node`` and :data:`HOST_VALUES` decoded, the
    arrays unnested in the select list (see :func:`jobsight.collector.tiers.reads.unpack_samples`)."""
    row, decoded = unpacking(list(HOST_ENCODINGS.values()))
    times, time = unpacking_times("b")
    return f"""SELECT cluster, {time} AS ts, node, {", ".join(decoded)} FROM (
            SELECT b.cluster, b.node, {", ".join([*times, *row])} FROM {blocks} b {where}
        ) unnested"""


def samples(*, job: str = "%(job)s", cluster: str = "%(cluster)s", start: str | None = None,
            end: str | None = None) -> str:
    """One job's host samples from both tiers, each once: ``ts``, ``node`` and :data:`HOST_VALUES`,
    with ``start`` and ``end`` (SQL, inclusive) bounding ``ts`` when given."""
    bounds = ([f"ts >= {start}"] if start else []) + ([f"ts <= {end}"] if end else [])
    hot = " AND ".join([f"job_id = {job}", f"cluster = {cluster}", *bounds])
    # Blocks of hour ts hold times in [ts, ts + 1 h): the hours in the window, then its rows.
    block_bounds = ([f"b.ts > {start} - {BLOCK_INTERVAL}"] if start else []) + ([f"b.ts <= {end}"] if end else [])
    packed = " AND ".join([f"b.job_id = {job}", f"b.cluster = {cluster}", *block_bounds])
    columns = ", ".join(["ts", "node", *HOST_VALUES])
    return f"""(
        SELECT {columns} FROM host_samples WHERE {hot}
        UNION ALL
        SELECT {columns} FROM ({_unpack("host_sample_blocks", "WHERE " + packed)}) p
        {"WHERE " + " AND ".join(bounds) if bounds else ""}
    )"""


RANGE: Final = sample_range("host_samples", "host_sample_blocks")
"""First and last host sample of a job over both tiers."""

_STORED, _PACKED = pack_columns(HOST_ENCODINGS.values())
_TIMES, _TIME_VALUES = packed_times("p.sample_ts")

PACK_HOUR: Final = f"""
WITH old AS (
    DELETE FROM host_sample_blocks WHERE job_id = %(job)s AND ts = %(hour)s RETURNING *
), src AS (
    SELECT cluster, ts, node, {", ".join(HOST_VALUES)}
    FROM host_samples WHERE job_id = %(job)s AND ts >= %(hour)s AND ts < %(hour)s + {BLOCK_INTERVAL}
    UNION ALL
    {_unpack("old", "")}
), integers AS (
    SELECT s.*, {pack_integers(HOST_ENCODINGS.values())} FROM src s
), bounded AS (
    SELECT s.*, {pack_window(HOST_ENCODINGS.values())}
    FROM integers s WINDOW g AS (PARTITION BY s.cluster, s.node ORDER BY {HOST.order}
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
), packed AS (
    SELECT s.cluster, s.node, count(*)::int4 AS samples, min(s.ts) AS first_ts, max(s.ts) AS last_ts,
           array_agg(s.ts ORDER BY {HOST.order}) AS sample_ts, {pack_aggregates(HOST_ENCODINGS.values())}
    FROM bounded s GROUP BY s.cluster, s.node
), new_blocks AS (
    INSERT INTO host_sample_blocks (cluster, job_id, ts, block, node, samples, first_ts, last_ts, {_TIMES},
                                    {_STORED})
    SELECT p.cluster, %(job)s, %(hour)s, (row_number() OVER (PARTITION BY p.cluster ORDER BY p.node NULLS FIRST))::int4,
           p.node, p.samples, p.first_ts, p.last_ts, {_TIME_VALUES}, {_PACKED}
    FROM packed p, {offsets("p.sample_ts", "%(hour)s")}
    RETURNING samples
)
SELECT coalesce(sum(samples), 0) FROM new_blocks
"""
"""One job-hour of host samples: the raw rows and the hour's blocks (deleted here and packed again
with them), one block per node, in the four steps of the GPU blocks' packing."""
