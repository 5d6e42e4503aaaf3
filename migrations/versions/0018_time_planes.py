"""packed sample times as byte planes

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27

A packed block's times (``gpu_sample_timelines``, ``host_sample_blocks``) were a timestamptz[]
(``sample_ts``): 8 bytes a sample, of which pglz found only the repeated high bytes. Each time
is now its block's hour plus whole seconds (``ts_s_p0``, ``ts_s_p1``) and microseconds
(``ts_us_p0``.. ``ts_us_p2``), each a byte plane, as the measurements are
(collector/tiers/time_planes.py); ``sample_ts`` becomes nullable and stays for the blocks packed
before, which are read as they were and repacked in planes when a late sample reaches their hour.
The columns are added (no rewrite).

Downgrade writes every block's times back into ``sample_ts``, drops the planes and restores NOT NULL.
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_TABLES = ("gpu_sample_timelines", "host_sample_blocks")
_PLANES = ("ts_s_p0", "ts_s_p1", "ts_us_p0", "ts_us_p1", "ts_us_p2")


def upgrade() -> None:
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN sample_ts DROP NOT NULL, "
                   + ", ".join(f'ADD COLUMN {plane} "char"[]' for plane in _PLANES))


def _byte(plane: str, k: int) -> str:
    return f"coalesce((u.{plane}::int4 + 128) << {8 * k}, 0)"


# As time_planes.py decoded them at 0018: the hour plus seconds and microseconds; a missing plane is zeros.
_TIMES = f"""(SELECT array_agg(b.ts + interval '1 microsecond' * (
                   ({_byte("ts_s_p0", 0)} | {_byte("ts_s_p1", 1)})::int8 * 1000000
                   + ({_byte("ts_us_p0", 0)} | {_byte("ts_us_p1", 1)} | {_byte("ts_us_p2", 2)})) ORDER BY u.n)
             FROM unnest({", ".join(f"b.{plane}" for plane in _PLANES)})
                  WITH ORDINALITY AS u({", ".join(_PLANES)}, n))"""


def downgrade() -> None:
    for table in _TABLES:
        op.execute(f"UPDATE {table} b SET sample_ts = {_TIMES} WHERE b.sample_ts IS NULL")
        op.execute(f"ALTER TABLE {table} " + ", ".join(f"DROP COLUMN {plane}" for plane in reversed(_PLANES))
                   + ", ALTER COLUMN sample_ts SET NOT NULL")
