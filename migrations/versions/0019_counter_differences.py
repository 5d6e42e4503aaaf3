"""packed counters as differences from the previous sample

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27

A counter (a GPU's ``energy_j``) grows by about the same amount every
sample: its low bytes are noise but its middle bytes, which count up, were stored too. A block with
no NULL in such a column, whose values span less than 2^31 (of its step), now keeps the first value
(``<name>_first``) and, in its first four planes, each sample's difference from the previous one as
an int4 (the first's 0), which is what the counter carries; the reader adds them up. Other blocks keep the values as before (``<name>_first`` NULL). The
columns are added (no rewrite).

Downgrade writes a counter block's values, as floats, into the array every version reads first
(``energy_j_f``), clears its planes, then drops the column.
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# As packed_format.py had them at 0019: table, counter, the float array a downgrade writes, and
# the divisor that makes the value from the integer (times the block's step, where it has one).
_COUNTERS = (
    ("gpu_sample_blocks", "energy_j", "energy_j_f", 1000, True),
)


def upgrade() -> None:
    for table, column, *_ in _COUNTERS:
        op.execute(f"ALTER TABLE {table} ADD COLUMN {column}_first int8")


def _values(column: str, divisor: int, stepped: bool) -> str:
    """The counter block's values as float8[]: its first plus the running sum of its differences,
    int4 in its first four planes."""
    names = [f"p{k}" for k in range(4)]
    bytes_ = " | ".join(
        f"coalesce((u.{n}::int4 + 128) << {8 * k}, 0)" if k else f"(u.{n}::int4 + 128)" for k, n in enumerate(names))
    step = f" * coalesce(b.{column}_step, 1)" if stepped else ""
    return f"""(SELECT array_agg((x.v{step})::float8 / {divisor} ORDER BY x.n)
        FROM (SELECT u.n, b.{column}_first + sum({bytes_}) OVER (ORDER BY u.n) AS v
              FROM unnest({", ".join(f"b.{column}_p{k}" for k in range(4))})
                   WITH ORDINALITY AS u({", ".join(names)}, n)) x)"""


def downgrade() -> None:
    for table, column, array, divisor, stepped in _COUNTERS:
        cleared = ", ".join([f"{column}_base = NULL", *(f"{column}_p{k} = NULL" for k in range(4)),
                             *([f"{column}_step = NULL"] if stepped else [])])
        op.execute(f"""UPDATE {table} b SET {array} = {_values(column, divisor, stepped)}, {cleared}
                       WHERE b.{column}_first IS NOT NULL""")
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}_first")
