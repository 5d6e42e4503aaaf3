"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 00:05:43.030745
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('gpu_samples',
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('node', sa.Text(), nullable=True),
    sa.Column('gpu_index', sa.SmallInteger(), nullable=False),
    sa.Column('gpu_uuid', sa.Text(), nullable=False),
    sa.Column('gpu_name', sa.Text(), nullable=True),
    sa.Column('mig_uuid', sa.Text(), nullable=True),
    sa.Column('util_gpu', sa.Float(), nullable=True),
    sa.Column('util_mem', sa.Float(), nullable=True),
    sa.Column('mem_used', sa.BigInteger(), nullable=True),
    sa.Column('mem_total', sa.BigInteger(), nullable=True),
    sa.Column('power_w', sa.Float(), nullable=True),
    sa.Column('energy_j', sa.Double(), nullable=True),
    sa.Column('temp_c', sa.Float(), nullable=True),
    sa.Column('sm_clock_mhz', sa.Integer(), nullable=True),
    sa.Column('mem_clock_mhz', sa.Integer(), nullable=True),
    sa.Column('pcie_tx_kbs', sa.Integer(), nullable=True),
    sa.Column('pcie_rx_kbs', sa.Integer(), nullable=True),
    sa.Column('throttle_reasons', sa.BigInteger(), nullable=True),
    sa.Column('ecc_errors', sa.BigInteger(), nullable=True),
    sa.Column('process_count', sa.Integer(), nullable=True),
    sa.Column('sm_active', sa.Float(), nullable=True),
    sa.Column('tensor_active', sa.Float(), nullable=True),
    sa.Column('lost', sa.Boolean(), nullable=True),
    postgresql_partition_by='RANGE (ts)'
    )
    op.create_index(op.f('ix_gpu_samples_job_id_ts'), 'gpu_samples', ['job_id', 'ts'], unique=False)
    op.create_table('host_samples',
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('node', sa.Text(), nullable=True),
    sa.Column('cpu_util', sa.Float(), nullable=True),
    sa.Column('cpu_time_s', sa.Double(), nullable=True),
    sa.Column('mem_used', sa.BigInteger(), nullable=True),
    sa.Column('mem_limit', sa.BigInteger(), nullable=True),
    postgresql_partition_by='RANGE (ts)'
    )
    op.create_index(op.f('ix_host_samples_job_id_ts'), 'host_samples', ['job_id', 'ts'], unique=False)
    op.create_table('ingest_batches',
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('records', sa.Integer(), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('source', 'seq', name=op.f('pk_ingest_batches'))
    )
    op.create_index(op.f('ix_ingest_batches_received_at'), 'ingest_batches', ['received_at'], unique=False)
    op.create_table('job_summaries',
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('computed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('gpu_count', sa.Integer(), nullable=True),
    sa.Column('gpu_hours', sa.Double(), nullable=True),
    sa.Column('mean_util', sa.Double(), nullable=True),
    sa.Column('energy_kwh', sa.Double(), nullable=True),
    sa.Column('flags', postgresql.ARRAY(sa.Text()), nullable=True),
    sa.Column('summary', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.PrimaryKeyConstraint('cluster', 'job_id', name=op.f('pk_job_summaries'))
    )
    op.create_table('jobs',
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('user_name', sa.Text(), nullable=True),
    sa.Column('uid', sa.Integer(), nullable=True),
    sa.Column('account', sa.Text(), nullable=True),
    sa.Column('partition', sa.Text(), nullable=True),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('nodes', postgresql.ARRAY(sa.Text()), nullable=True),
    sa.Column('node_count', sa.Integer(), nullable=True),
    sa.Column('gpus', postgresql.ARRAY(sa.Text()), nullable=True),
    sa.Column('time_limit_s', sa.Integer(), nullable=True),
    sa.Column('start_time', sa.DateTime(timezone=True), nullable=True),
    sa.Column('end_time', sa.DateTime(timezone=True), nullable=True),
    sa.Column('state', sa.Text(), server_default=sa.text("'running'"), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('demo', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('attrs', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('first_seen', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('cluster', 'job_id', name=op.f('pk_jobs'))
    )
    op.create_index(op.f('ix_jobs_start_time'), 'jobs', ['start_time'], unique=False)
    op.create_index(op.f('ix_jobs_state'), 'jobs', ['state'], unique=False)
    op.create_index(op.f('ix_jobs_user_name'), 'jobs', ['user_name'], unique=False)
    op.create_table('log_events',
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('node', sa.Text(), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('tid', sa.BigInteger(), nullable=True),
    sa.Column('thread', sa.Text(), nullable=True),
    sa.Column('level', sa.Text(), nullable=False),
    sa.Column('logger', sa.Text(), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('exception', sa.Text(), nullable=True),
    sa.Column('attrs', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    postgresql_partition_by='RANGE (ts)'
    )
    op.create_index(op.f('ix_log_events_job_id_ts'), 'log_events', ['job_id', 'ts'], unique=False)
    op.create_table('metrics',
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('node', sa.Text(), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('step', sa.BigInteger(), nullable=True),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('value', sa.Double(), nullable=False),
    postgresql_partition_by='RANGE (ts)'
    )
    op.create_index(op.f('ix_metrics_job_id_name_ts'), 'metrics', ['job_id', 'name', 'ts'], unique=False)
    op.create_table('profile_requests',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('requested_by', sa.Text(), nullable=True),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('ranks', postgresql.ARRAY(sa.Integer()), nullable=True),
    sa.Column('state', sa.Text(), server_default=sa.text("'pending'"), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('profile_id', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_profile_requests'))
    )
    op.create_index(op.f('ix_profile_requests_job_id_state'), 'profile_requests', ['job_id', 'state'], unique=False)
    op.create_table('profiles',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('node', sa.Text(), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('profile_id', sa.Text(), nullable=False),
    sa.Column('request_id', sa.BigInteger(), nullable=True),
    sa.Column('step_start', sa.BigInteger(), nullable=True),
    sa.Column('step_end', sa.BigInteger(), nullable=True),
    sa.Column('summary', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('diagnosis', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('trace_gz', sa.LargeBinary(), nullable=True),
    sa.Column('note', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_profiles'))
    )
    op.create_index(op.f('ix_profiles_job_id_ts'), 'profiles', ['job_id', 'ts'], unique=False)
    op.create_table('steps',
    sa.Column('cluster', sa.Text(), nullable=False),
    sa.Column('job_id', sa.Text(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('node', sa.Text(), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=True),
    sa.Column('phase', sa.Text(), nullable=True),
    sa.Column('duration_s', sa.Double(), nullable=False),
    sa.Column('data_wait_s', sa.Double(), nullable=True),
    sa.Column('compute_s', sa.Double(), nullable=True),
    sa.Column('samples', sa.Integer(), nullable=True),
    postgresql_partition_by='RANGE (ts)'
    )
    op.create_index(op.f('ix_steps_job_id_ts'), 'steps', ['job_id', 'ts'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_steps_job_id_ts'), table_name='steps')
    op.drop_table('steps')
    op.drop_index(op.f('ix_profiles_job_id_ts'), table_name='profiles')
    op.drop_table('profiles')
    op.drop_index(op.f('ix_profile_requests_job_id_state'), table_name='profile_requests')
    op.drop_table('profile_requests')
    op.drop_index(op.f('ix_metrics_job_id_name_ts'), table_name='metrics')
    op.drop_table('metrics')
    op.drop_index(op.f('ix_log_events_job_id_ts'), table_name='log_events')
    op.drop_table('log_events')
    op.drop_index(op.f('ix_jobs_user_name'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_state'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_start_time'), table_name='jobs')
    op.drop_table('jobs')
    op.drop_table('job_summaries')
    op.drop_index(op.f('ix_ingest_batches_received_at'), table_name='ingest_batches')
    op.drop_table('ingest_batches')
    op.drop_index(op.f('ix_host_samples_job_id_ts'), table_name='host_samples')
    op.drop_table('host_samples')
    op.drop_index(op.f('ix_gpu_samples_job_id_ts'), table_name='gpu_samples')
    op.drop_table('gpu_samples')
