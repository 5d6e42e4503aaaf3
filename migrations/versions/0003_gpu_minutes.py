"""per-minute GPU rollup

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

Charts of long jobs read minute sums instead of every sample. Jobs ingested before this
revision have no rollup rows; the read path falls back to the raw samples for them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_minutes",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("gpu_index", sa.SmallInteger(), nullable=False),
        sa.Column("mig_uuid", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("util_gpu_sum", sa.Double(), nullable=False),
        sa.Column("util_gpu_n", sa.Integer(), nullable=False),
        sa.Column("util_gpu_max", sa.Float(), nullable=True),
        sa.Column("util_idle_n", sa.Integer(), nullable=False),
        sa.Column("util_mem_sum", sa.Double(), nullable=False),
        sa.Column("util_mem_n", sa.Integer(), nullable=False),
        sa.Column("mem_used_max", sa.BigInteger(), nullable=True),
        sa.Column("mem_total_max", sa.BigInteger(), nullable=True),
        sa.Column("power_sum", sa.Double(), nullable=False),
        sa.Column("power_n", sa.Integer(), nullable=False),
        sa.Column("temp_sum", sa.Double(), nullable=False),
        sa.Column("temp_n", sa.Integer(), nullable=False),
        sa.Column("energy_min", sa.Double(), nullable=True),
        sa.Column("energy_max", sa.Double(), nullable=True),
        sa.Column("energy_n", sa.Integer(), nullable=False),
        sa.Column("first_ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lost", sa.Boolean(), nullable=False),
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_index(
        "uq_gpu_minutes_key", "gpu_minutes", ["job_id", "cluster", "node", "gpu_index", "mig_uuid", "ts"], unique=True
    )


def downgrade() -> None:
    op.drop_index("uq_gpu_minutes_key", table_name="gpu_minutes")
    op.drop_table("gpu_minutes")
