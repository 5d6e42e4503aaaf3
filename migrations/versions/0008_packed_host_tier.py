"""packed tier for host samples

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23

Closed days of host_samples are rewritten by the compaction pass, like the GPU samples, into
one row per job, node and UTC hour (host_sample_blocks): the sample times and each measurement
an array, with the values as they were stored. The table is partitioned by day; its partitions
are made by the pass.

Downgrade unpacks every packed row back into host_samples (making its daily partitions where
they are missing) before dropping the table, so no sample is lost. The SQL below is a copy of
the format as of this revision, not an import, so that it stays what it was.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
_VALUES = ("cpu_util", "cpu_time_s", "mem_used", "mem_limit")

_UNPACK = f"""
INSERT INTO host_samples (cluster, job_id, ts, node, {", ".join(_VALUES)})
SELECT b.cluster, b.job_id, u.ts, b.node, {", ".join(f"u.{v}" for v in _VALUES)}
FROM host_sample_blocks b
CROSS JOIN LATERAL unnest(b.sample_ts, {", ".join(f"b.{v}" for v in _VALUES)}) AS u(ts, {", ".join(_VALUES)})
"""


def upgrade() -> None:
    op.create_table(
        "host_sample_blocks",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("first_ts", _TS, nullable=False),
        sa.Column("last_ts", _TS, nullable=False),
        sa.Column("sample_ts", postgresql.ARRAY(_TS), nullable=False),
        sa.Column("cpu_util", postgresql.ARRAY(sa.Float()), nullable=False),
        sa.Column("cpu_time_s", postgresql.ARRAY(sa.Double()), nullable=False),
        sa.Column("mem_used", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("mem_limit", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "cluster", "ts", "block", name=op.f("pk_host_sample_blocks")),
        postgresql_partition_by="RANGE (ts)",
    )


def _packed_days(bind: sa.engine.Connection) -> list[dt.date]:
    rows = bind.execute(sa.text(
        """SELECT DISTINCT right(child.relname, 8) FROM pg_inherits
           JOIN pg_class parent ON parent.oid = pg_inherits.inhparent
           JOIN pg_class child ON child.oid = pg_inherits.inhrelid
           WHERE parent.relname = 'host_sample_blocks'"""
    )).fetchall()
    return sorted(dt.datetime.strptime(r[0], "%Y%m%d").date() for r in rows)


def downgrade() -> None:
    bind = op.get_bind()
    # A pass killed while packing a day leaves its trigger on the day's raw partitions: it would
    # refuse the rows put back below.
    stray = bind.execute(sa.text(
        """SELECT format('DROP TRIGGER %I ON %I', t.tgname, c.relname) FROM pg_trigger t
           JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname = 'jobsight_compacting'"""
    )).fetchall()
    for (statement,) in stray:
        bind.execute(sa.text(statement))
    for day in _packed_days(bind):
        bind.execute(sa.text(
            f"CREATE TABLE IF NOT EXISTS host_samples_p{day:%Y%m%d} PARTITION OF host_samples "
            f"FOR VALUES FROM ('{day.isoformat()} 00:00:00+00') "
            f"TO ('{(day + dt.timedelta(days=1)).isoformat()} 00:00:00+00')"
        ))
    bind.execute(sa.text(_UNPACK))
    op.drop_table("host_sample_blocks")
