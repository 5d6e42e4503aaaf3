"""health findings, their alert outbox, and the forward time of steps

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25

``findings`` holds what the health rules noticed about running jobs (one open row per job,
rule and subject at a time), ``alert_outbox`` the alerts to send for them, written in the same
transaction. ``steps.forward_s`` (batch arrival to backward start) and its per-minute sums in
``step_minutes`` are what the straggler rule compares across data-parallel ranks. Existing rows
keep NULL there: they were sent before agents measured it. Downgrade drops all of it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Added to the partitioned parents, so every daily partition gets the column.
    op.add_column("steps", sa.Column("forward_s", sa.Double(), nullable=True))
    op.add_column("step_minutes", sa.Column("forward_sum", sa.Double(), nullable=True))
    op.add_column("step_minutes", sa.Column("forward_n", sa.Integer(), nullable=True))
    op.create_table(
        "findings",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("rule", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("gpu", sa.Text(), nullable=True),
        sa.Column("severity", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'open'"), nullable=False),
        sa.Column("opened_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("resolved_at", _TS, nullable=True),
        sa.Column("at_ts", _TS, nullable=True),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "id", name=op.f("pk_findings")),
    )
    op.create_index("uq_findings_open", "findings", ["job_id", "cluster", "rule", "subject"], unique=True,
                    postgresql_where=sa.text("state = 'open'"))
    op.create_index(op.f("ix_findings_state"), "findings", ["state"])
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("finding_id", sa.BigInteger(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("sink", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("next_try_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("sent_at", _TS, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "id", name=op.f("pk_alert_outbox")),
    )
    op.create_index("uq_alert_outbox_event", "alert_outbox", ["job_id", "finding_id", "event", "sink"], unique=True)
    op.create_index("ix_alert_outbox_unsent", "alert_outbox", ["next_try_at"],
                    postgresql_where=sa.text("sent_at IS NULL"))


def downgrade() -> None:
    op.drop_table("alert_outbox")
    op.drop_table("findings")
    op.drop_column("step_minutes", "forward_n")
    op.drop_column("step_minutes", "forward_sum")
    op.drop_column("steps", "forward_s")
