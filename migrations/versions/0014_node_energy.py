"""node energy beside the GPUs, and emissions

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24

The node daemon's node power source (RAPL, IPMI or Redfish), split across the jobs of the node by
CPU time: each host sample carries the job's joules since its previous sample and the source and
split it came from (nullable ``host_samples`` columns, added to every partition without a rewrite;
arrays of the packed ``host_sample_blocks``, where older blocks read them as NULL). Job summaries
keep the node part in kWh and the job's emissions in kg CO2e beside the GPUs' energy, for the audit.

Downgrade drops them: the node energy of samples already stored is lost.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_COLUMNS = (("energy_j", sa.Float()), ("power_source", sa.Text()), ("energy_split", sa.Text()))


def upgrade() -> None:
    for name, type_ in _COLUMNS:
        op.add_column("host_samples", sa.Column(name, type_, nullable=True))
    for name, type_ in _COLUMNS:
        op.add_column("host_sample_blocks", sa.Column(name, postgresql.ARRAY(type_), nullable=True))
    op.add_column("job_summaries", sa.Column("node_energy_kwh", sa.Double(), nullable=True))
    op.add_column("job_summaries", sa.Column("co2e_kg", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("job_summaries", "co2e_kg")
    op.drop_column("job_summaries", "node_energy_kwh")
    for table in ("host_sample_blocks", "host_samples"):
        for name, _ in reversed(_COLUMNS):
            op.drop_column(table, name)
