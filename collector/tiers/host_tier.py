"""Host samples in their two tiers: the reader of both, and how the compaction pass packs an hour.

The hot tier is ``host_samples``, a row per node and tick; the packed tier is
``host_sample_blocks``, a row per job, node and UTC hour with the sample times and each
measurement an array, the values as they were stored. An hour is in one tier or the other, but
late samples for a packed hour land in ``host_samples`` until the next pass merges them: both
are always read. The SQL conventions are :mod:`jobsight.collector.tiers.reads`'.
"""

from __future__ import annotations

from typing import Final

from jobsight.collector.store.schema import SERIES_KEY, host_samples
from jobsight.collector.tiers.reads import sample_range

HOST_VALUES: Final = tuple(c.name for c in host_samples.columns if c.name not in SERIES_KEY)
"""The measurements of a host sample (``cpu_util``, ``cpu_time_s``, ``mem_used``, ``mem_limit``)."""

_HOUR: Final = "interval '1 hour'"
_UTC_HOUR: Final = "date_bin('1 hour', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00')"


def _unpack(blocks: str, where: str) -> str:
    values = ", ".join(f"b.{v}" for v in HOST_VALUES)
    return f"""SELECT b.cluster, u.ts, b.node, {", ".join(f"u.{v}" for v in HOST_VALUES)}
        FROM {blocks} b CROSS JOIN LATERAL unnest(b.sample_ts, {values}) AS u(ts, {", ".join(HOST_VALUES)})
        {where}"""


def samples(*, job: str = "%(job)s", cluster: str = "%(cluster)s", start: str | None = None,
            end: str | None = None) -> str:
    """One job's host samples from both tiers, each once: ``ts``, ``node`` and :data:`HOST_VALUES`,
    with ``start`` and ``end`` (SQL, inclusive) bounding ``ts`` when given."""
    bounds = ([f"ts >= {start}"] if start else []) + ([f"ts <= {end}"] if end else [])
    hot = " AND ".join([f"job_id = {job}", f"cluster = {cluster}", *bounds])
    # Blocks of hour ts hold times in [ts, ts + 1 h): the hours in the window, then its rows.
    block_bounds = ([f"b.ts > {start} - {_HOUR}"] if start else []) + ([f"b.ts <= {end}"] if end else [])
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

# Every array of a block is aggregated in the same order, all columns breaking ties, so the
# arrays stay in step even for two samples of one node at one time.
_ORDER: Final = ", ".join(["ts", *HOST_VALUES])

PACK_HOUR: Final = f"""
WITH old AS (
    DELETE FROM host_sample_blocks WHERE job_id = %(job)s AND ts = %(hour)s RETURNING *
), src AS (
    SELECT cluster, ts, node, {", ".join(HOST_VALUES)}
    FROM host_samples WHERE job_id = %(job)s AND ts >= %(hour)s AND ts < %(hour)s + {_HOUR}
    UNION ALL
    {_unpack("old", "")}
), packed AS (
    SELECT cluster, {_UTC_HOUR} AS hour, node, count(*)::int4 AS samples, min(ts) AS first_ts,
           max(ts) AS last_ts, array_agg(ts ORDER BY {_ORDER}) AS sample_ts,
           {", ".join(f"array_agg({v} ORDER BY {_ORDER}) AS {v}" for v in HOST_VALUES)}
    FROM src GROUP BY cluster, {_UTC_HOUR}, node
), new_blocks AS (
    INSERT INTO host_sample_blocks (cluster, job_id, ts, block, node, samples, first_ts, last_ts, sample_ts,
                                    {", ".join(HOST_VALUES)})
    SELECT cluster, %(job)s, hour, (row_number() OVER (PARTITION BY cluster, hour ORDER BY node NULLS FIRST))::int4,
           node, samples, first_ts, last_ts, sample_ts, {", ".join(HOST_VALUES)}
    FROM packed
    RETURNING samples
)
SELECT coalesce(sum(samples), 0) FROM new_blocks
"""
"""One job-hour of host samples: the raw rows and the hour's blocks (deleted here and packed again
with them), one block per node."""
