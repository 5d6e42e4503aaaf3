"""the steps waste policies take

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24

``actions``: each warning, action, exemption or held-back action of a policy (collector/passes/actions.py),
one row per (finding, policy, step), dry runs included; and the job's QOS, comment and batch flag
(the prolog's, from ``squeue --json``), which policies exempt by; ``jobs.end_reason`` (why jobsight
ended the job); ``notices``, the outbox of warnings, job-end summaries and periodic reports.
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
    op.add_column("jobs", sa.Column("end_reason", sa.Text(), nullable=True))
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
    op.create_table(
        "notices",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("sink", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("lines", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("notify_type", sa.Text(), server_default=sa.text("'info'"), nullable=False),
        sa.Column("created_at", sa.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("next_try_at", sa.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("sent_at", sa.TIMESTAMP(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "id", name="pk_notices"),
    )
    op.create_index("uq_notices_key", "notices", ["job_id", "key", "sink"], unique=True)
    op.create_index("ix_notices_unsent", "notices", ["next_try_at"], postgresql_where=sa.text("sent_at IS NULL"))


def downgrade() -> None:
    op.drop_table("notices")
    op.drop_table("actions")
    for column in ("end_reason", "batch", "comment", "qos"):
        op.drop_column("jobs", column)
