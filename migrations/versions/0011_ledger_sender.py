"""the ingest ledger belongs to its sender

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24

A batch's ``(source, seq)`` was a key shared by everyone: a user who sent one harmless batch under
the predictable source of a node's prolog (``{cluster}/{node}:slurm-prolog:{job}.0``, seq 0) made the
real prolog's batch a "duplicate", silently dropped. The key now holds the sender too
(``ingest_batches.sender``: ``admin``, ``node:<cluster>/<node>``, ``job:<cluster>/<job>``), so a
sender can only ever make its own batches duplicates.

Rows stored before this revision have no known sender: they get ``*``, which the collector reads as
"any sender" (collector/ingest/write.py), so a batch stored before the upgrade and replayed after it is
still acknowledged once, as it was. Downgrade keeps one row per ``(source, seq)``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ingest_batches", sa.Column("sender", sa.Text(), server_default=sa.text("'*'"), nullable=False))
    # Every new row names its sender: no default that could quietly make one "any sender".
    op.alter_column("ingest_batches", "sender", server_default=None)
    op.drop_constraint("pk_ingest_batches", "ingest_batches", type_="primary")
    op.create_primary_key("pk_ingest_batches", "ingest_batches", ["source", "sender", "seq"])


def downgrade() -> None:
    op.execute("""DELETE FROM ingest_batches a USING ingest_batches b
                  WHERE a.source = b.source AND a.seq = b.seq AND a.sender > b.sender""")
    op.drop_constraint("pk_ingest_batches", "ingest_batches", type_="primary")
    op.create_primary_key("pk_ingest_batches", "ingest_batches", ["source", "seq"])
    op.drop_column("ingest_batches", "sender")
