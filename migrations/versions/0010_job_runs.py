"""runs of a requeued job

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26

Slurm requeues a job under the same id (``SLURM_JOB_RESTART_COUNT`` 0, 1, ...). The job row keeps
its latest run: ``jobs.run`` (its number) and ``jobs.run_start`` (when it started; NULL for run 0,
which starts at ``jobs.start_time``), with the run's end, state and exit code in the columns they
always were. Reads and the summary are scoped to ``ts >= run_start``, so samples and steps of
earlier runs are not mixed in. When a later run starts, the one it replaces is closed into
``job_runs`` (one row per earlier run: start, end, state, exit code), which is what GPU-hours of
every run are counted from. Existing jobs are run 0. Downgrade drops all of it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("run", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("jobs", sa.Column("run_start", _TS, nullable=True))
    op.create_table(
        "job_runs",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("start_time", _TS, nullable=True),
        sa.Column("end_time", _TS, nullable=True),
        sa.Column("state", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("cluster", "job_id", "run", name=op.f("pk_job_runs")),
    )


def downgrade() -> None:
    op.drop_table("job_runs")
    op.drop_column("jobs", "run_start")
    op.drop_column("jobs", "run")
