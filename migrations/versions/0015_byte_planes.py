"""packed GPU samples in byte planes

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25

A packed block keeps each measurement as integers XORed with the block's least value and cut into
byte planes (``<name>_base`` and ``<name>_p0``... ``"char"[]``), a plane of zeros not stored: the
bytes that change little compress to nearly nothing, where whole values with noisy low bytes did
not compress at all. The columns are added (no rewrite); blocks packed before keep their arrays,
which are read as before, and are repacked in planes when a late sample is merged into their hour.

Downgrade writes the planes of every block back into the arrays 0004 made (an energy counter that
spans more than int4 mJ in an hour into ``energy_j_f``, as 0004's pass did), then drops them.
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# Planes per column: 4 for values kept as int4, 8 for int8 (as schema.PLANES had them at 0015).
_PLANES = {
    "util_gpu": 4, "util_mem": 4, "mem_used": 8, "mem_total": 8, "power_w": 4, "energy_j": 8, "temp_c": 4,
    "sm_clock_mhz": 4, "mem_clock_mhz": 4, "pcie_tx_kbs": 4, "pcie_rx_kbs": 4, "throttle_reasons": 8,
    "ecc_errors": 8, "process_count": 4, "sm_active": 4, "tensor_active": 4, "nvlink_crc_errors": 8,
    "nvlink_replay_errors": 8, "nvlink_recovery_errors": 8, "pcie_replays": 8,
}


def _columns() -> list[tuple[str, str]]:
    return [(name, type_) for column, planes in _PLANES.items()
            for name, type_ in [(f"{column}_base", "int4" if planes == 4 else "int8"),
                                *((f"{column}_p{k}", '"char"[]') for k in range(planes))]]


def upgrade() -> None:
    # One statement: one lock of the partitioned table and its partitions, no rewrite.
    op.execute("ALTER TABLE gpu_sample_blocks " + ", ".join(f"ADD COLUMN {n} {t}" for n, t in _columns()))


# The arrays blocks had before (0004): their planes' column and the array's element type, and the
# scale of the float columns that 0004 kept as integers.
_LEGACY = {
    "util_gpu": ("util_gpu", "int2"), "util_mem": ("util_mem", "int2"), "mem_used": ("mem_used", "int8"),
    "mem_total": ("mem_total", "int8"), "power_w": ("power_mw", "int4"), "temp_c": ("temp_c", "int2"),
    "sm_clock_mhz": ("sm_clock_mhz", "int4"), "mem_clock_mhz": ("mem_clock_mhz", "int4"),
    "pcie_tx_kbs": ("pcie_tx_kbs", "int4"), "pcie_rx_kbs": ("pcie_rx_kbs", "int4"),
    "throttle_reasons": ("throttle_reasons", "int8"), "ecc_errors": ("ecc_errors", "int8"),
    "process_count": ("process_count", "int4"), "sm_active": ("sm_active", "int2"),
    "tensor_active": ("tensor_active", "int2"), "nvlink_crc_errors": ("nvlink_crc_errors", "int8"),
    "nvlink_replay_errors": ("nvlink_replay_errors", "int8"),
    "nvlink_recovery_errors": ("nvlink_recovery_errors", "int8"), "pcie_replays": ("pcie_replays", "int8"),
}
_ENERGY_SPAN_MJ = 2**32 - 1


def _values(column: str) -> str:
    """The block's integers of ``column`` as an int8[] in sample order, from its planes."""
    planes = _PLANES[column]
    names = [f"p{k}" for k in range(planes)]
    kind = "int4" if planes == 4 else "int8"
    bytes_ = " | ".join(
        f"coalesce((u.{n}::int4 + 128)::{kind} << {8 * k}, 0)" if k else f"(u.{n}::int4 + 128)::{kind}"
        for k, n in enumerate(names))
    return f"""CASE WHEN b.{column}_p0 IS NULL THEN array_fill(b.{column}_base::int8, ARRAY[b.samples])
        ELSE (SELECT array_agg((b.{column}_base # ({bytes_}))::int8 ORDER BY u.n)
              FROM unnest({", ".join(f"b.{column}_p{k}" for k in range(planes))})
                   WITH ORDINALITY AS u({", ".join(names)}, n)) END"""


def downgrade() -> None:
    for column, (legacy, element) in _LEGACY.items():
        op.execute(f"""UPDATE gpu_sample_blocks b SET {legacy} = ({_values(column)})::{element}[]
                       WHERE b.{column}_base IS NOT NULL""")
    op.execute(f"""
        UPDATE gpu_sample_blocks b SET
            energy_mj_base = CASE WHEN e.hi - e.lo <= {_ENERGY_SPAN_MJ} THEN e.lo + 2147483648 END,
            energy_mj = CASE WHEN e.hi - e.lo <= {_ENERGY_SPAN_MJ} THEN
                (SELECT array_agg((v - e.lo - 2147483648)::int4 ORDER BY n) FROM unnest(e.mj) WITH ORDINALITY u(v, n))
                END,
            energy_j_f = CASE WHEN e.hi - e.lo > {_ENERGY_SPAN_MJ} THEN
                (SELECT array_agg(v::float8 / 1000 ORDER BY n) FROM unnest(e.mj) WITH ORDINALITY u(v, n))
                END
        FROM (SELECT b.job_id, b.cluster, b.ts, b.device, m.mj, m.lo, m.hi
              FROM gpu_sample_blocks b,
                   LATERAL (SELECT x.mj, (SELECT min(v) FROM unnest(x.mj) v) AS lo,
                                   (SELECT max(v) FROM unnest(x.mj) v) AS hi
                            FROM (SELECT {_values("energy_j")} AS mj) x) m
              WHERE b.energy_j_base IS NOT NULL) e
        WHERE b.job_id = e.job_id AND b.cluster = e.cluster AND b.ts = e.ts AND b.device = e.device""")
    columns = _columns()
    op.execute("ALTER TABLE gpu_sample_blocks " + ", ".join(f"DROP COLUMN {n}" for n, _ in reversed(columns)))
