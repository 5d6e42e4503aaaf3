"""How ``gpu_samples`` columns are kept in the packed tier (``gpu_sample_blocks``), declared once.

A block is one job's samples of one GPU in one UTC hour. The sample times live in the
block's timeline (``gpu_sample_timelines.sample_ts``, shared by the GPUs of a node that were
sampled at the same ticks); every measurement is an array in the same order. Each column's
:class:`Encoding` gives the SQL aggregates that build its arrays from the samples of a block
(used by :mod:`jobsight.collector.tiers.compaction`) and the SQL expression that gives the value
back from the unnested elements (used by :mod:`jobsight.collector.tiers.reads` and by the merge of
late samples).

The encodings, smallest first, and why each is exact:

* whole numbers stored as floats (``util_gpu``, ``util_mem``, ``temp_c``: NVML reports whole
  percents and degrees) go into ``int2[]``; ``power_w`` (NVML: milliwatts / 1000) into ``int4[]``
  of mW; ``energy_j`` (NVML: millijoules / 1000) into ``int4[]`` of mJ from a per-block base
  (an hour of a 1.2 kW GPU fits). A block takes these only when *every* value of the block
  comes back bit-for-bit from them (checked in SQL with the very expression that decodes it);
  otherwise the block keeps the column in its float8 ``_f`` twin, as it was.
* integer and boolean columns keep their own type (the fault counters and flags too: they
  change seldom, and a run of one value is what pglz compresses best).
* ``sm_active`` and ``tensor_active`` (GPM ratios: arbitrary doubles from NVML, which no pglz
  compresses) go into ``int2[]`` of hundredths of a percentage point, rounded: the only lossy
  columns, to within 0.005 points (an exact value of two decimals comes back exactly). No query
  reads them; the hot tier keeps them as they came for its day. A block with a value outside
  the int2 range keeps them in float8.

A column whose values are all NULL in a block is a NULL array (not an array of NULLs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

ORDER: Final = (
    "s.ts, s.util_gpu, s.util_mem, s.mem_used, s.mem_total, s.power_w, s.energy_j, s.temp_c, s.sm_clock_mhz, "
    "s.mem_clock_mhz, s.pcie_tx_kbs, s.pcie_rx_kbs, s.throttle_reasons, s.ecc_errors, s.process_count, "
    "s.sm_active, s.tensor_active, s.lost, s.nvlink_crc_errors, s.nvlink_replay_errors, s.nvlink_recovery_errors, "
    "s.pcie_replays, s.remapped_rows_pending, s.remap_failure, s.retired_pages_pending"
)
"""The order of a block's samples: time, then the values, so that samples sharing a time are in
the same order in every array (each ``array_agg`` sorts on its own unless the planner shares the
sort) and a block packs to the same bytes however its rows were stored."""

ENERGY_MJ: Final = "CASE WHEN abs(s.energy_j) < 4e12 THEN round(s.energy_j * 1000) END"
"""A sample's energy in whole mJ (float8). Under 4e12 J the mJ stay under 2^53, where float8
holds every integer; a block's ``e_lo`` and ``e_hi`` are its least and greatest."""

ENERGY_SPAN_MJ: Final = 2**32 - 1
"""Widest range of energy counter values (mJ) one block keeps as int4 offsets from its base."""


@dataclass(frozen=True)
class Encoding:
    """One ``gpu_samples`` column in ``gpu_sample_blocks``.

    ``stored`` are the block columns it fills, ``aggregates`` the SQL that fills them (one
    each; over the block's samples ``s``, which also carry ``e_lo``/``e_hi``, the block's
    lowest and highest energy in mJ). ``arrays`` are the array columns to unnest to read it,
    and ``decode`` the SQL giving the value back from their elements, named ``u_<array>``, and
    the block's scalar columns, named ``b_<column>``."""

    column: str
    stored: tuple[str, ...]
    aggregates: tuple[str, ...]
    arrays: tuple[str, ...]
    decode: str


def _ordered(expression: str) -> str:
    return f"array_agg({expression} ORDER BY {ORDER})"


def _unless_all_null(column: str, aggregate: str) -> str:
    return f"CASE WHEN count(s.{column}) > 0 THEN {aggregate} END"


def _plain(column: str) -> Encoding:
    return Encoding(
        column=column,
        stored=(column,),
        aggregates=(_unless_all_null(column, _ordered(f"s.{column}")),),
        arrays=(column,),
        decode=f"u_{column}",
    )


def _scaled(column: str, array: str, element: str, scale: int, bound: int, *, rounded: bool = False) -> Encoding:
    """A float column whose values are ``integer / scale``: the integers, when every value of
    the block comes back exactly (or, ``rounded``, fits), else the floats in ``<column>_f``."""
    fallback = f"{column}_f"
    scaled = f"round(s.{column} * {scale})" if scale != 1 else f"round(s.{column})"
    decoded = f"u_{array}::float8 / {scale}" if scale != 1 else f"u_{array}::float8"
    # The test decodes with the reader's expression, so "exact" means bit-for-bit (but for -0.0).
    # BETWEEN also refuses NaN and infinities, which PostgreSQL would otherwise call equal; CASE
    # (not AND, whose order PostgreSQL may change) keeps the casts from values out of range.
    fits = f"s.{column} BETWEEN {-bound} AND {bound}"
    kept = "true" if rounded else f"{scaled}::{element}::float8 / {scale} = s.{column}"
    exact = f"bool_and(CASE WHEN s.{column} IS NULL THEN true WHEN {fits} THEN {kept} ELSE false END)"
    return Encoding(
        column=column,
        stored=(array, fallback),
        aggregates=(
            f"CASE WHEN count(s.{column}) > 0 AND {exact} "
            f"THEN {_ordered(f'CASE WHEN {fits} THEN {scaled}::{element} END')} END",
            f"CASE WHEN count(s.{column}) > 0 AND NOT {exact} THEN {_ordered(f's.{column}')} END",
        ),
        arrays=(array, fallback),
        decode=f"coalesce(u_{fallback}, {decoded})",
    )


def _energy() -> Encoding:
    """``energy_j``: mJ as int4 offsets from the block's base (its lowest value + 2^31), when the
    block's counter spans at most :data:`ENERGY_SPAN_MJ` and every value is whole mJ."""
    mj = ENERGY_MJ
    values_exact = (
        f"bool_and(CASE WHEN s.energy_j IS NULL THEN true WHEN {mj} IS NULL THEN false "
        f"ELSE {mj}::int8::float8 / 1000 = s.energy_j END)"
    )
    exact = f"({values_exact} AND max(s.e_hi) - min(s.e_lo) <= {ENERGY_SPAN_MJ})"
    offset = f"CASE WHEN s.e_hi - s.e_lo <= {ENERGY_SPAN_MJ} THEN ({mj} - s.e_lo - 2147483648)::int4 END"
    return Encoding(
        column="energy_j",
        stored=("energy_mj_base", "energy_mj", "energy_j_f"),
        aggregates=(
            f"CASE WHEN count(s.energy_j) > 0 AND {exact} THEN min(s.e_lo)::int8 + 2147483648 END",
            f"CASE WHEN count(s.energy_j) > 0 AND {exact} THEN {_ordered(offset)} END",
            f"CASE WHEN count(s.energy_j) > 0 AND NOT {exact} THEN {_ordered('s.energy_j')} END",
        ),
        arrays=("energy_mj", "energy_j_f"),
        decode="coalesce(u_energy_j_f, (b_energy_mj_base + u_energy_mj)::float8 / 1000)",
    )


ENCODINGS: Final[dict[str, Encoding]] = {
    e.column: e
    for e in (
        _scaled("util_gpu", "util_gpu", "int2", 1, 32767),
        _scaled("util_mem", "util_mem", "int2", 1, 32767),
        _plain("mem_used"),
        _plain("mem_total"),
        _scaled("power_w", "power_mw", "int4", 1000, 2_000_000),
        _energy(),
        _scaled("temp_c", "temp_c", "int2", 1, 32767),
        _plain("sm_clock_mhz"),
        _plain("mem_clock_mhz"),
        _plain("pcie_tx_kbs"),
        _plain("pcie_rx_kbs"),
        _plain("throttle_reasons"),
        _plain("ecc_errors"),
        _plain("process_count"),
        _scaled("sm_active", "sm_active", "int2", 100, 327, rounded=True),
        _scaled("tensor_active", "tensor_active", "int2", 100, 327, rounded=True),
        _plain("lost"),
        _plain("nvlink_crc_errors"),
        _plain("nvlink_replay_errors"),
        _plain("nvlink_recovery_errors"),
        _plain("pcie_replays"),
        _plain("remapped_rows_pending"),
        _plain("remap_failure"),
        _plain("retired_pages_pending"),
    )
}
"""Every measurement column of ``gpu_samples``, in table order."""

DEVICE_COLUMNS: Final = ("node", "gpu_index", "gpu_uuid", "gpu_name", "mig_uuid")
"""The ``gpu_samples`` columns a block names through ``gpu_devices``."""

