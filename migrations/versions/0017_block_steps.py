"""packed GPU blocks keep coarse values as quotients

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25

The node daemon sends power in 0.1 W, energy in J, PCIe throughput in MB/s and the GPM ratios in
tenths of a point, coarser than the units the columns are kept in (mW, mJ, KB/s, hundredths). A
block whose every value of such a column is a multiple of that step keeps the quotients in its
planes and the step in ``<name>_step`` (NULL: the values themselves, as every block before).
The columns are added (no rewrite).

Downgrade writes a stepped block's values back whole into the arrays 0004 made (``power_mw``,
``pcie_tx_kbs``, ``sm_active``... and ``energy_j_f`` for energy), which 0015 and later read before
the planes, clears its planes, then drops the steps.
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# As schema.STEPS had them at 0017: the step, the planes, and the array a downgrade writes (its
# element type, and the divisor that makes the value from the integer).
_STEPS = {
    "power_w": (100, 4, "power_mw", "int4", 1), "energy_j": (1000, 8, "energy_j_f", "float8", 1000),
    "pcie_tx_kbs": (1000, 4, "pcie_tx_kbs", "int4", 1), "pcie_rx_kbs": (1000, 4, "pcie_rx_kbs", "int4", 1),
    "sm_active": (10, 4, "sm_active", "int2", 1), "tensor_active": (10, 4, "tensor_active", "int2", 1),
}


def upgrade() -> None:
    op.execute("ALTER TABLE gpu_sample_blocks " + ", ".join(f"ADD COLUMN {c}_step int2" for c in _STEPS))


def _values(column: str) -> str:
    """The stepped block's values of ``column`` as the downgrade's array, from its planes."""
    step, planes, _, element, divisor = _STEPS[column]
    names = [f"p{k}" for k in range(planes)]
    kind = "int4" if planes == 4 else "int8"
    bytes_ = " | ".join(
        f"coalesce((u.{n}::int4 + 128)::{kind} << {8 * k}, 0)" if k else f"(u.{n}::int4 + 128)::{kind}"
        for k, n in enumerate(names))
    value = f"(v * {step})::{element}" if divisor == 1 else f"((v * {step})::float8 / {divisor})"
    return f"""CASE WHEN b.{column}_p0 IS NULL THEN array_fill((b.{column}_base::int8 * {step})::{element}, ARRAY[b.samples])
        ELSE (SELECT array_agg({value} ORDER BY x.n)
              FROM (SELECT (b.{column}_base # ({bytes_}))::int8 AS v, u.n
                    FROM unnest({", ".join(f"b.{column}_p{k}" for k in range(planes))})
                         WITH ORDINALITY AS u({", ".join(names)}, n)) x) END"""


def downgrade() -> None:
    for column, (_, planes, array, _, _) in _STEPS.items():
        cleared = ", ".join(f"{column}_p{k} = NULL" for k in range(planes))
        op.execute(f"""UPDATE gpu_sample_blocks b SET {array} = {_values(column)}, {column}_base = NULL, {cleared}
                       WHERE b.{column}_step IS NOT NULL""")
    op.execute("ALTER TABLE gpu_sample_blocks " + ", ".join(f"DROP COLUMN {c}_step" for c in reversed(_STEPS)))
