"""The packed tier's format in numbers: every parameter that decides what a block's bytes are.

The format itself is specified in ``docs/format/packed.md`` (what a block is, its planes, steps,
counters, time planes and device dictionary, with a worked example). This module holds the
numbers that spec names; :mod:`jobsight.collector.tiers.packed_format` and
:mod:`jobsight.collector.tiers.time_planes` turn them into the SQL that packs and reads blocks,
and :mod:`jobsight.collector.store.schema` makes the blocks' columns from them.

Why in ``store/``: the schema makes a column per plane, per step and per counter from these
numbers, and the store room may not import the tiers room (``tests/layout/import_rules.py``).
Like Prometheus' format leaves (``tsdb/chunkenc``), it imports nothing of the project.

A block carries no version number: what it holds says which format packed it (``docs/format/
packed.md``, "Versions"). So a number here cannot change alone: blocks already packed keep the old
one, and a change takes a migration and a reader of both, as migrations 0015-0019 did. Those
migrations keep their own copies of these numbers, as they were when each was applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

BYTE_TYPE: Final = '"char"'
"""PostgreSQL's one-byte type (-128..127), the element of every byte plane."""
BYTE_OFFSET: Final = 128
"""A plane's byte ``b`` (0..255) is stored as the ``"char"`` ``b - 128``."""

BLOCK_SECONDS: Final = 3600
"""A block holds the samples of one UTC hour (``ts`` is the hour's start)."""
BLOCK_INTERVAL: Final = "interval '1 hour'"
""":data:`BLOCK_SECONDS` as SQL: a block of hour ``ts`` holds the times in [ts, ts + this)."""

# Sample times (migration 0018): the offset from the block's hour, in seconds and microseconds.
MICROS_PER_SECOND: Final = 1_000_000
SECOND_PLANES: Final = 2
"""Bytes of a sample's whole seconds into its block's hour (0..3599)."""
MICRO_PLANES: Final = 3
"""Bytes of its microseconds into the second (0..999999)."""
TIME_PLANES: Final = (*(f"ts_s_p{k}" for k in range(SECOND_PLANES)), *(f"ts_us_p{k}" for k in range(MICRO_PLANES)))
"""The columns a block's times are kept in, besides ``sample_ts`` (times outside the hour, and blocks
packed before 0018)."""


@dataclass(frozen=True)
class Scale:
    """A float8 column kept as integers: a value ``v`` is the integer ``round(v * scale)``.

    ``bound``: values outside ``-bound..bound`` (in the column's unit; NaN and infinities too) have no
    integer, and their block keeps the floats. ``rounded``: the integers are rounded, the column's
    only loss (GPM ratios); otherwise a block takes the integers only when every value comes back
    from them bit for bit."""

    scale: int
    bound: int
    rounded: bool = False


PLANES: Final[dict[str, int]] = {
    "util_gpu": 4, "util_mem": 4, "mem_used": 8, "mem_total": 8, "power_w": 4, "energy_j": 8, "temp_c": 4,
    "sm_clock_mhz": 4, "mem_clock_mhz": 4, "pcie_tx_kbs": 4, "pcie_rx_kbs": 4, "throttle_reasons": 8,
    "ecc_errors": 8, "process_count": 4, "sm_active": 4, "tensor_active": 4, "nvlink_crc_errors": 8,
    "nvlink_replay_errors": 8, "nvlink_recovery_errors": 8, "pcie_replays": 8,
}
"""The ``gpu_samples`` columns a block keeps as byte planes (migration 0015), and how many: 4 for
values kept as int4 (whole percents, degrees, mW, MHz, KB/s), 8 for int8 (bytes, mJ, counters).
The other measurements (the booleans) are plain arrays."""

SCALES: Final[dict[str, Scale]] = {
    "util_gpu": Scale(1, 32767),
    "util_mem": Scale(1, 32767),
    "power_w": Scale(1000, 2_000_000),  # mW
    "energy_j": Scale(1000, 4_000_000_000_000),  # mJ; under 4e12 J the mJ stay under 2^53, exact in float8
    "temp_c": Scale(1, 32767),
    "sm_active": Scale(100, 327, rounded=True),  # hundredths of a percentage point
    "tensor_active": Scale(100, 327, rounded=True),
}
"""The float8 columns of ``gpu_samples`` among :data:`PLANES`; the others are integers already."""

STEPS: Final[dict[str, int]] = {"power_w": 100, "energy_j": 1000, "pcie_tx_kbs": 1000, "pcie_rx_kbs": 1000,
                                "sm_active": 10, "tensor_active": 10}
"""The ``gpu_samples`` columns a block may keep as quotients (migration 0017), and by what: its
integers' unit times the step is the precision the node daemon sends (0.1 W of mW, J of mJ, MB/s
of KB/s, tenths of a GPM point of hundredths). ``<name>_step`` says a block did."""

COUNTERS: Final = ("energy_j",)
"""The ``gpu_samples`` counters a block keeps as differences from the previous sample (migration
0019) when it has no NULL: ``<name>_first`` is the block's first value, its planes the differences."""
DIFFERENCE_PLANES: Final = 4
"""A counter block's differences are int4, in its first four planes."""
COUNTER_SPAN: Final = 2**31
"""A counter block's integers (or quotients by its step) span less than this, so each difference fits an int4."""
SPAN_GUARD: Final = 2**62
"""Values within +-2^62: their span does not overflow int8 (checked before :data:`COUNTER_SPAN`)."""

HOST_PLANES: Final[dict[str, int]] = {"cpu_util": 4, "cpu_time_s": 8, "mem_used": 8, "mem_limit": 8}
"""The ``host_samples`` columns a block keeps as byte planes (migration 0016): ``cpu_util`` in
hundredths of a percent (int4), ``cpu_time_s`` in microseconds and memory in bytes (int8)."""

HOST_SCALES: Final[dict[str, Scale]] = {
    # The agent sends hundredths of a percent; a block with any other value keeps its floats.
    "cpu_util": Scale(100, 1_000_000),
    # Seconds from the cgroup's microseconds (cgroup v2) or clock ticks (/proc); v1's ns stay floats.
    "cpu_time_s": Scale(1_000_000, 9_000_000_000_000),
}
"""The float8 columns of ``host_samples`` among :data:`HOST_PLANES`."""

DEVICE_COLUMNS: Final = ("node", "gpu_index", "gpu_uuid", "gpu_name", "mig_uuid")
"""The dictionary: the ``gpu_samples`` columns a GPU block names through ``gpu_devices.id`` (its ``device``)."""
