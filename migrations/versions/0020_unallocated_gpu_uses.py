"""GPUs used outside any job

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27

A process on a GPU that no job on its node was given used to be shipped under whatever
``SLURM_JOB_ID`` its environment claimed. The node daemon now reports it as what it is, a
``gpu_unallocated_use`` record naming no job, and the collector keeps those here for the admins
(``GET /v1/unallocated-gpu-uses``). No job_id: on Citus the table is distributed by node.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_unallocated_uses",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_index", sa.SmallInteger(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("uid", sa.Integer(), nullable=True),
        sa.Column("mem_used", sa.BigInteger(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("node", "cluster", "gpu_index", "ts", "pid", name="pk_gpu_unallocated_uses"),
    )
    op.create_index("ix_gpu_unallocated_uses_ts", "gpu_unallocated_uses", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_gpu_unallocated_uses_ts", table_name="gpu_unallocated_uses")
    op.drop_table("gpu_unallocated_uses")
