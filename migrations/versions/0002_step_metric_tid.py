"""thread id on step and metric rows

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

Every record of a training process is tagged with rank, pid and tid; steps and metrics
lacked the thread id. Adding a nullable column to a partitioned table adds it to every
partition without rewriting them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("metrics", sa.Column("tid", sa.BigInteger(), nullable=True))
    op.add_column("steps", sa.Column("tid", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("steps", "tid")
    op.drop_column("metrics", "tid")
