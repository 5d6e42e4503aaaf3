"""per-minute step rollup and epoch starts

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

The job page's step charts read per-rank minute sums of the training steps (step_minutes,
partitioned by day like steps) and its epoch markers one row per epoch (epoch_starts), instead
of every step row. Jobs ingested before this revision have no rows in either; the read path
falls back to the steps for them. Downgrade drops both: they are derived from steps, which stay.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "step_minutes",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("duration_sum", sa.Double(), nullable=False),
        sa.Column("duration_max", sa.Double(), nullable=False),
        sa.Column("data_wait_sum", sa.Double(), nullable=True),
        sa.Column("samples_sum", sa.BigInteger(), nullable=True),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("first_ts", _TS, nullable=False),
        sa.Column("last_ts", _TS, nullable=False),
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_index("uq_step_minutes_key", "step_minutes", ["job_id", "cluster", "ts", "rank"], unique=True)
    op.create_table(
        "epoch_starts",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "cluster", "epoch", name=op.f("pk_epoch_starts")),
    )


def downgrade() -> None:
    op.drop_table("epoch_starts")
    # Dropping the parent drops its daily partitions (the collector made them) with it.
    op.drop_index("uq_step_minutes_key", table_name="step_minutes")
    op.drop_table("step_minutes")
