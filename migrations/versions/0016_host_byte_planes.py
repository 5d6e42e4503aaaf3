"""packed host samples in byte planes

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25

A packed host block keeps ``cpu_util`` (hundredths of a percent), ``cpu_time_s`` (microseconds)
and memory (bytes) as byte planes of integers, as 0015 did for GPU blocks: ``<name>_base`` and
``<name>_p0``... The arrays named as the columns stay: blocks packed before keep their values
there (read as before, repacked in planes when a late sample merges into their hour), and a
block whose floats are not such integers keeps them there; so they may now be NULL.

Downgrade writes the planes back into those arrays, then drops them.
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# Per column (as schema.HOST_PLANES and packed_format.HOST_ENCODINGS had them at 0016): its planes,
# the array's element type, and the scale of its integers.
_COLUMNS = {"cpu_util": (4, "float8", 100), "cpu_time_s": (8, "float8", 1_000_000), "mem_used": (8, "int8", 1),
            "mem_limit": (8, "int8", 1)}


def _planes(column: str) -> list[tuple[str, str]]:
    planes, _, _ = _COLUMNS[column]
    return [(f"{column}_base", "int4" if planes == 4 else "int8"),
            *((f"{column}_p{k}", '"char"[]') for k in range(planes))]


def upgrade() -> None:
    # One statement: one lock of the partitioned table and its partitions, no rewrite.
    changes = [*(f"ALTER COLUMN {c} DROP NOT NULL" for c in _COLUMNS),
               *(f"ADD COLUMN {n} {t}" for c in _COLUMNS for n, t in _planes(c))]
    op.execute("ALTER TABLE host_sample_blocks " + ", ".join(changes))


def _value(column: str, integer: str) -> str:
    """The value an integer of ``column`` stands for."""
    _, element, scale = _COLUMNS[column]
    return integer if scale == 1 else f"({integer}::float8 / {scale})::{element}"


def _values(column: str) -> str:
    """The block's values of ``column`` as its array, from its planes (NULLs where it has none)."""
    planes, element, _ = _COLUMNS[column]
    names = [f"p{k}" for k in range(planes)]
    kind = "int4" if planes == 4 else "int8"
    bytes_ = " | ".join(
        f"coalesce((u.{n}::int4 + 128)::{kind} << {8 * k}, 0)" if k else f"(u.{n}::int4 + 128)::{kind}"
        for k, n in enumerate(names))
    return f"""CASE WHEN b.{column}_base IS NULL THEN array_fill(NULL::{element}, ARRAY[b.samples])
        WHEN b.{column}_p0 IS NULL THEN array_fill(({_value(column, f"b.{column}_base")})::{element}, ARRAY[b.samples])
        ELSE (SELECT array_agg({_value(column, "x.v")} ORDER BY x.n)
              FROM (SELECT b.{column}_base # ({bytes_}) AS v, u.n
                    FROM unnest({", ".join(f"b.{column}_p{k}" for k in range(planes))})
                         WITH ORDINALITY AS u({", ".join(names)}, n)) x) END"""


def downgrade() -> None:
    for column in _COLUMNS:
        op.execute(f"UPDATE host_sample_blocks b SET {column} = {_values(column)} WHERE b.{column} IS NULL")
    changes = [*(f"DROP COLUMN {n}" for c in reversed(_COLUMNS) for n, _ in reversed(_planes(c))),
               *(f"ALTER COLUMN {c} SET NOT NULL" for c in _COLUMNS)]
    op.execute("ALTER TABLE host_sample_blocks " + ", ".join(changes))
