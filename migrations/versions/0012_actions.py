"""the steps waste policies take

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24

``actions``: each warning, action, exemption or held-back action of a policy (collector/passes/actions.py),
one row per (finding, policy, step), dry runs included; and the job's QOS, comment and batch flag
(the prolog's, from ``squeue --json``), which policies exempt by.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("qos", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("comment", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("batch", sa.Boolean(), nullable=True))
    op.create_table(
        "actions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("finding_id", sa.BigInteger(), nullable=False),
        sa.Column("policy", sa.Text(), nullable=False),
        sa.Column("rule", sa.Text(), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("at", sa.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "id", name="pk_actions"),
    )
    op.create_index("uq_actions_step", "actions", ["job_id", "cluster", "finding_id", "policy", "step"], unique=True)
    op.create_index("ix_actions_at", "actions", ["at"])


def downgrade() -> None:
    op.drop_table("actions")
    for column in ("batch", "comment", "qos"):
        op.drop_column("jobs", column)
