"""GPU fault counters and events

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24

What says why a GPU is slow or failing, from the node daemon: NVLink error counters (CRC,
replay, recovery, summed over the links), PCIe replays, and the memory's row remapping and page
retirement flags, as nullable ``gpu_samples`` columns (added to every partition without a
rewrite) and as arrays of the packed tier's ``gpu_sample_blocks``, where they keep their type.
``gpu_events``: critical Xid errors as NVML reported them, a row per event and job, partitioned
by day like the samples (the collector makes its partitions).

Downgrade drops them: the counters of samples already stored, and the events, are lost.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_COUNTERS = ("nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors", "pcie_replays")
_FLAGS = ("remapped_rows_pending", "remap_failure", "retired_pages_pending")


def upgrade() -> None:
    for name in _COUNTERS:
        op.add_column("gpu_samples", sa.Column(name, sa.BigInteger(), nullable=True))
    for name in _FLAGS:
        op.add_column("gpu_samples", sa.Column(name, sa.Boolean(), nullable=True))
    for name in _COUNTERS:
        op.add_column("gpu_sample_blocks", sa.Column(name, postgresql.ARRAY(sa.BigInteger()), nullable=True))
    for name in _FLAGS:
        op.add_column("gpu_sample_blocks", sa.Column(name, postgresql.ARRAY(sa.Boolean()), nullable=True))
    op.create_table(
        "gpu_events",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("gpu_index", sa.SmallInteger(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("code", sa.BigInteger(), nullable=False),
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_index(op.f("ix_gpu_events_job_id_ts"), "gpu_events", ["job_id", "ts"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_gpu_events_job_id_ts"), table_name="gpu_events")
    op.drop_table("gpu_events")
    for table in ("gpu_sample_blocks", "gpu_samples"):
        for name in reversed((*_COUNTERS, *_FLAGS)):
            op.drop_column(table, name)
