"""per-hour GPU rollup

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25

Charts of multi-day jobs read hour sums (gpu_hours, the columns of gpu_minutes per UTC hour)
instead of every minute: a 64-GPU, 9-day job is 14 k rows there against 830 k minutes. The
table is partitioned by day like gpu_minutes; the compaction pass leaves it as it is.

Upgrade makes its partitions for every day that has a gpu_minutes or gpu_minute_blocks
partition and fills them with the hour sums of both tiers of minutes, so that jobs stored
before this revision read the same from it. Downgrade drops it: it is derived from the minutes,
which stay. The SQL below is a copy of the rollup's format as of this revision, not an import,
so that it stays what it was.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
_KEY = ("cluster", "job_id", "ts", "node", "gpu_index", "mig_uuid")
_VALUES = [
    ("gpu_uuid", sa.Text(), False), ("samples", sa.Integer(), False), ("util_gpu_sum", sa.Double(), False),
    ("util_gpu_n", sa.Integer(), False), ("util_gpu_max", sa.Float(), True), ("util_idle_n", sa.Integer(), False),
    ("util_mem_sum", sa.Double(), False), ("util_mem_n", sa.Integer(), False),
    ("mem_used_max", sa.BigInteger(), True), ("mem_total_max", sa.BigInteger(), True),
    ("power_sum", sa.Double(), False), ("power_n", sa.Integer(), False), ("temp_sum", sa.Double(), False),
    ("temp_n", sa.Integer(), False), ("energy_min", sa.Double(), True), ("energy_max", sa.Double(), True),
    ("energy_n", sa.Integer(), False), ("first_ts", _TS, False), ("last_ts", _TS, False),
    ("lost", sa.Boolean(), False),
]
_NAMES = [name for name, _, _ in _VALUES]

# How the minutes of an hour make the hour, as the ingest path adds them up.
_MERGE = {
    "gpu_uuid": "min", "samples": "sum", "util_gpu_sum": "sum", "util_gpu_n": "sum", "util_gpu_max": "max",
    "util_idle_n": "sum", "util_mem_sum": "sum", "util_mem_n": "sum", "mem_used_max": "max",
    "mem_total_max": "max", "power_sum": "sum", "power_n": "sum", "temp_sum": "sum", "temp_n": "sum",
    "energy_min": "min", "energy_max": "max", "energy_n": "sum", "first_ts": "min", "last_ts": "max",
    "lost": "bool_or",
}
# Packed minute counts that equal `samples` throughout their block are NULL.
_SAMPLE_COUNTS = ("util_gpu_n", "util_mem_n", "power_n", "temp_n", "energy_n")
# UTC hours whatever the session's time zone.
_HOUR = "date_bin('1 hour', ts, TIMESTAMPTZ '2000-01-01 00:00:00+00')"

# One day's hours from the minutes of both tiers (a minute that got late samples after its day
# was packed has a row in each: they add up). The packed side is bounded on its blocks' hours.
_BACKFILL_DAY = f"""
INSERT INTO gpu_hours ({", ".join(_KEY)}, {", ".join(_NAMES)})
SELECT cluster, job_id, {_HOUR}, node, gpu_index, mig_uuid, {", ".join(f"{_MERGE[n]}({n})" for n in _NAMES)}
FROM (
    SELECT {", ".join(_KEY)}, {", ".join(_NAMES)} FROM gpu_minutes WHERE ts >= :day AND ts < :day_end
    UNION ALL
    SELECT b.cluster, b.job_id, u.ts, b.node, b.gpu_index, b.mig_uuid,
           {", ".join(f"coalesce(u.{n}, u.samples)" if n in _SAMPLE_COUNTS else f"u.{n}" for n in _NAMES)}
    FROM gpu_minute_blocks b
    CROSS JOIN LATERAL unnest(b.minute_ts, {", ".join(f"b.{n}" for n in _NAMES)}) AS u(ts, {", ".join(_NAMES)})
    WHERE b.ts >= :day AND b.ts < :day_end
) m
GROUP BY cluster, job_id, {_HOUR}, node, gpu_index, mig_uuid
"""


def _minute_days(bind: sa.engine.Connection) -> list[dt.date]:
    """The days with a partition of either tier of minutes (named ``<table>_pYYYYMMDD``)."""
    rows = bind.execute(sa.text(
        """SELECT DISTINCT right(child.relname, 8) FROM pg_inherits
           JOIN pg_class parent ON parent.oid = pg_inherits.inhparent
           JOIN pg_class child ON child.oid = pg_inherits.inhrelid
           WHERE parent.relname IN ('gpu_minutes', 'gpu_minute_blocks')"""
    )).fetchall()
    return sorted(dt.datetime.strptime(r[0], "%Y%m%d").date() for r in rows)


def upgrade() -> None:
    op.create_table(
        "gpu_hours",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("node", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("gpu_index", sa.SmallInteger(), nullable=False),
        sa.Column("mig_uuid", sa.Text(), server_default=sa.text("''"), nullable=False),
        *(sa.Column(name, kind, nullable=nullable) for name, kind, nullable in _VALUES),
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_index(
        "uq_gpu_hours_key", "gpu_hours", ["job_id", "cluster", "node", "gpu_index", "mig_uuid", "ts"], unique=True
    )
    bind = op.get_bind()
    for day in _minute_days(bind):
        start = dt.datetime.combine(day, dt.time(), dt.UTC)
        # The collector's partition name and bounds (collector/store/partitions.py).
        op.execute(f"""CREATE TABLE gpu_hours_p{day:%Y%m%d} PARTITION OF gpu_hours
                       FOR VALUES FROM ('{day.isoformat()} 00:00:00+00')
                       TO ('{day + dt.timedelta(days=1)} 00:00:00+00')""")
        bind.execute(sa.text(_BACKFILL_DAY), {"day": start, "day_end": start + dt.timedelta(days=1)})


def downgrade() -> None:
    # Dropping the parent drops its daily partitions (the collector made them) with it.
    op.drop_index("uq_gpu_hours_key", table_name="gpu_hours")
    op.drop_table("gpu_hours")
