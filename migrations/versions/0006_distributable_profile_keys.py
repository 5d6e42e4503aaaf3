"""profiles and profile_requests keyed by (job_id, id)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

Citus checks uniqueness inside one shard, so every key of a table distributed by job_id must
hold job_id. The two profile tables had id-only primary keys; every read of them names the
job already, and ids still come from one identity sequence each, so they stay unique.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLES = ("profiles", "profile_requests")


def upgrade() -> None:
    for table in TABLES:
        op.drop_constraint(f"pk_{table}", table, type_="primary")
        op.create_primary_key(f"pk_{table}", table, ["job_id", "id"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_constraint(f"pk_{table}", table, type_="primary")
        op.create_primary_key(f"pk_{table}", table, ["id"])
