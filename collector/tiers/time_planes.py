"""The SQL that packs and reads a block's sample times as byte planes (migration 0018), for GPU
timelines and host blocks.

The format is in ``docs/format/packed.md`` ("Time planes"); its numbers (:data:`TIME_PLANES`,
seconds and microseconds planes) in :mod:`jobsight.collector.store.packed_params`. In short: each
time is its block's hour plus whole seconds (``ts_s_p0``, ``ts_s_p1``) and microseconds into the
second (``ts_us_p0``.. ``ts_us_p2``), cut into bytes as the measurements are. A plane of zeros is
not stored (NULL), except ``ts_s_p0``, which is always stored: arrays unnested side by side give as
many rows as the longest, and a block whose every measurement is one value stores no array but its
times. A block whose times do not all fall in its hour (none the pass makes) keeps them in
``sample_ts``, as every block packed before 0018 does, and stores no plane.
"""

from __future__ import annotations

from typing import Final

from jobsight.collector.store.packed_params import (
    BLOCK_SECONDS,
    BYTE_OFFSET,
    BYTE_TYPE,
    MICRO_PLANES,
    MICROS_PER_SECOND,
    SECOND_PLANES,
    TIME_PLANES,
)

_US: Final = MICROS_PER_SECOND
_HOUR_US: Final = BLOCK_SECONDS * _US


# No "%" in this SQL: it is run with parameters, where psycopg would read it as a placeholder.
def offsets(times: str, hour: str) -> str:
    """A LATERAL subquery over the array of times ``times`` (SQL) of the hour ``hour`` (SQL), named
    ``m``: ``m.e`` each time's microseconds after the hour (in the array's order), ``m.fits``
    whether all fall in the hour, and the bits that are ever set in the seconds and the
    microseconds (a plane is stored only if one of its bits is)."""
    return f"""LATERAL (
        SELECT array_agg(x.e ORDER BY x.n) AS e, bool_and(x.e >= 0 AND x.e < {_HOUR_US}) AS fits,
               bit_or(x.e / {_US}) AS s_bits, bit_or(mod(x.e, {_US})) AS us_bits
        FROM (SELECT (extract(epoch FROM u.v - ({hour})) * {_US})::int8 AS e, u.n
              FROM unnest({times}) WITH ORDINALITY u(v, n)) x
    ) m"""


def _plane(part: str, k: int) -> str:
    return (f"ARRAY(SELECT ((({part} >> {8 * k}) & 255) - {BYTE_OFFSET})::int4::{BYTE_TYPE} "
            f"FROM unnest(m.e) WITH ORDINALITY u(e, n) ORDER BY u.n)")


def packed_times(times: str) -> tuple[str, str]:
    """(the columns ``sample_ts`` and :data:`TIME_PLANES`, their SQL over :func:`offsets` ``m`` of
    the array of times ``times``)."""
    values = [f"CASE WHEN m.fits THEN NULL ELSE {times} END"]
    seconds, micros = f"(u.e / {_US})", f"mod(u.e, {_US})"
    for k in range(SECOND_PLANES):
        needed = "m.fits" if k == 0 else f"m.fits AND (m.s_bits >> {8 * k}) & 255 <> 0"
        values.append(f"CASE WHEN {needed} THEN {_plane(seconds, k)} END")
    for k in range(MICRO_PLANES):
        values.append(f"CASE WHEN m.fits AND (m.us_bits >> {8 * k}) & 255 <> 0 THEN {_plane(micros, k)} END")
    return ", ".join(["sample_ts", *TIME_PLANES]), ", ".join(values)


def _integer(prefix: str, planes: int) -> str:
    """The integer of a sample from its unnested planes ``u_<prefix><k>``; a missing plane is zeros."""
    return " | ".join(f"coalesce((u_{prefix}{k}::int4 + {BYTE_OFFSET}) << {8 * k}, 0)" for k in range(planes))


def unpacking_times(block: str) -> tuple[list[str], str]:
    """What reading the times of the block (or timeline) ``block`` takes: (its select-list items,
    arrays unnested as ``u_<column>`` and the hour as ``b_time_hour``; the SQL of each sample's time
    over them)."""
    row = [f"{block}.ts AS b_time_hour", f"unnest({block}.sample_ts) AS u_sample_ts",
           *(f"unnest({block}.{plane}) AS u_{plane}" for plane in TIME_PLANES)]
    micros = f"({_integer('ts_s_p', SECOND_PLANES)})::int8 * {_US} + ({_integer('ts_us_p', MICRO_PLANES)})"
    return row, f"coalesce(u_sample_ts, b_time_hour + interval '1 microsecond' * ({micros}))"
