"""packed tier for GPU samples and minutes

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

Closed days of gpu_samples and gpu_minutes are rewritten by the compaction pass into one row
per job, GPU and hour with typed arrays (collector/tiers/packed_format.py), GPUs named by a small
dictionary (gpu_devices) and sample times shared by the GPUs of a node (gpu_sample_timelines).
The new tables are partitioned by day like the raw ones; their partitions are made by the pass.

Downgrade unpacks every packed row back into gpu_samples and gpu_minutes (making their daily
partitions where they are missing) before dropping the tables, so no sample is lost (the GPM
ratios sm_active and tensor_active come back as packed: to the nearest 0.01 point). The SQL
below is a copy of the format as of this revision, not an import, so that it stays what it was.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)

# Packed minute counts that equal `samples` throughout their block are NULL.
_SAMPLE_COUNTS = ("util_gpu_n", "util_mem_n", "power_n", "temp_n", "energy_n")
_MINUTE_VALUES = [
    ("gpu_uuid", sa.Text()), ("samples", sa.Integer()), ("util_gpu_sum", sa.Double()), ("util_gpu_n", sa.Integer()),
    ("util_gpu_max", sa.Float()), ("util_idle_n", sa.Integer()), ("util_mem_sum", sa.Double()),
    ("util_mem_n", sa.Integer()), ("mem_used_max", sa.BigInteger()), ("mem_total_max", sa.BigInteger()),
    ("power_sum", sa.Double()), ("power_n", sa.Integer()), ("temp_sum", sa.Double()), ("temp_n", sa.Integer()),
    ("energy_min", sa.Double()), ("energy_max", sa.Double()), ("energy_n", sa.Integer()), ("first_ts", _TS),
    ("last_ts", _TS), ("lost", sa.Boolean()),
]


# While the compaction pass packs a day, a trigger with this function sits on the day's raw
# partitions: a late row for the day fails with a serialization failure, which the ingest path
# answers 503 (its agent sends it again) without holding up the other batches of its group.
_REFUSE_FUNCTION = """
CREATE FUNCTION jobsight_refuse_while_compacting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
        MESSAGE = format('%s is being compacted; send the rows again later', TG_TABLE_NAME);
END
$$
"""


def upgrade() -> None:
    op.execute(_REFUSE_FUNCTION)
    op.create_table(
        "gpu_devices",
        sa.Column("id", sa.Integer(), sa.Identity(always=False), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("gpu_index", sa.SmallInteger(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("gpu_name", sa.Text(), nullable=True),
        sa.Column("mig_uuid", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_devices")),
    )
    op.create_index(op.f("ix_gpu_devices_gpu_uuid_gpu_index"), "gpu_devices", ["gpu_uuid", "gpu_index"])
    op.create_table(
        "gpu_sample_timelines",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("timeline", sa.Integer(), nullable=False),
        sa.Column("sample_ts", postgresql.ARRAY(_TS), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "cluster", "ts", "timeline", name=op.f("pk_gpu_sample_timelines")),
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_table(
        "gpu_sample_blocks",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("device", sa.Integer(), nullable=False),
        sa.Column("timeline", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("first_ts", _TS, nullable=False),
        sa.Column("last_ts", _TS, nullable=False),
        sa.Column("util_gpu", postgresql.ARRAY(sa.SmallInteger()), nullable=True),
        sa.Column("util_gpu_f", postgresql.ARRAY(sa.Double()), nullable=True),
        sa.Column("util_mem", postgresql.ARRAY(sa.SmallInteger()), nullable=True),
        sa.Column("util_mem_f", postgresql.ARRAY(sa.Double()), nullable=True),
        sa.Column("mem_used", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("mem_total", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("power_mw", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("power_w_f", postgresql.ARRAY(sa.Double()), nullable=True),
        sa.Column("energy_mj_base", sa.BigInteger(), nullable=True),
        sa.Column("energy_mj", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("energy_j_f", postgresql.ARRAY(sa.Double()), nullable=True),
        sa.Column("temp_c", postgresql.ARRAY(sa.SmallInteger()), nullable=True),
        sa.Column("temp_c_f", postgresql.ARRAY(sa.Double()), nullable=True),
        sa.Column("sm_clock_mhz", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("mem_clock_mhz", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("pcie_tx_kbs", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("pcie_rx_kbs", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("throttle_reasons", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("ecc_errors", postgresql.ARRAY(sa.BigInteger()), nullable=True),
        sa.Column("process_count", postgresql.ARRAY(sa.Integer()), nullable=True),
        sa.Column("sm_active", postgresql.ARRAY(sa.SmallInteger()), nullable=True),
        sa.Column("sm_active_f", postgresql.ARRAY(sa.Double()), nullable=True),
        sa.Column("tensor_active", postgresql.ARRAY(sa.SmallInteger()), nullable=True),
        sa.Column("tensor_active_f", postgresql.ARRAY(sa.Double()), nullable=True),
        sa.Column("lost", postgresql.ARRAY(sa.Boolean()), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "cluster", "ts", "device", name=op.f("pk_gpu_sample_blocks")),
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_table(
        "gpu_minute_blocks",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.SmallInteger(), nullable=False),
        sa.Column("mig_uuid", sa.Text(), nullable=False),
        sa.Column("minute_ts", postgresql.ARRAY(_TS), nullable=False),
        *(sa.Column(name, postgresql.ARRAY(kind), nullable=name in _SAMPLE_COUNTS) for name, kind in _MINUTE_VALUES),
        sa.PrimaryKeyConstraint("job_id", "cluster", "ts", "node", "gpu_index", "mig_uuid",
                                name=op.f("pk_gpu_minute_blocks")),
        postgresql_partition_by="RANGE (ts)",
    )


_SAMPLE_COLUMNS = (
    "util_gpu, util_mem, mem_used, mem_total, power_w, energy_j, temp_c, sm_clock_mhz, mem_clock_mhz, pcie_tx_kbs, "
    "pcie_rx_kbs, throttle_reasons, ecc_errors, process_count, sm_active, tensor_active, lost"
)
_ARRAYS = (
    "util_gpu, util_gpu_f, util_mem, util_mem_f, mem_used, mem_total, power_mw, power_w_f, energy_mj, energy_j_f, "
    "temp_c, temp_c_f, sm_clock_mhz, mem_clock_mhz, pcie_tx_kbs, pcie_rx_kbs, throttle_reasons, ecc_errors, "
    "process_count, sm_active, sm_active_f, tensor_active, tensor_active_f, lost"
)
_UNPACK_SAMPLES = f"""
INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, mig_uuid, {_SAMPLE_COLUMNS})
SELECT b.cluster, b.job_id, u.ts, d.node, d.gpu_index, d.gpu_uuid, d.gpu_name, d.mig_uuid,
       coalesce(u.util_gpu_f, u.util_gpu::float8), coalesce(u.util_mem_f, u.util_mem::float8), u.mem_used,
       u.mem_total, coalesce(u.power_w_f, u.power_mw::float8 / 1000),
       coalesce(u.energy_j_f, (b.energy_mj_base + u.energy_mj)::float8 / 1000), coalesce(u.temp_c_f, u.temp_c::float8),
       u.sm_clock_mhz, u.mem_clock_mhz, u.pcie_tx_kbs, u.pcie_rx_kbs, u.throttle_reasons, u.ecc_errors,
       u.process_count, coalesce(u.sm_active_f, u.sm_active::float8 / 100),
       coalesce(u.tensor_active_f, u.tensor_active::float8 / 100), u.lost
FROM gpu_sample_blocks b
JOIN gpu_sample_timelines t ON t.job_id = b.job_id AND t.cluster = b.cluster AND t.ts = b.ts AND t.timeline = b.timeline
JOIN gpu_devices d ON d.id = b.device
CROSS JOIN LATERAL unnest(t.sample_ts, {", ".join(f"b.{a}" for a in _ARRAYS.split(", "))}) AS u(ts, {_ARRAYS})
"""
_MINUTES = ", ".join(name for name, _ in _MINUTE_VALUES)
_ADDED = ("samples", "util_gpu_sum", "util_gpu_n", "util_idle_n", "util_mem_sum", "util_mem_n", "power_sum", "power_n",
          "temp_sum", "temp_n", "energy_n")
# A minute packed and a minute of late samples not yet merged add up, as the ingest upsert does.
_UNPACK_MINUTES = f"""
INSERT INTO gpu_minutes AS g (cluster, job_id, ts, node, gpu_index, mig_uuid, {_MINUTES})
SELECT b.cluster, b.job_id, u.minute_ts, b.node, b.gpu_index, b.mig_uuid,
       {", ".join(f"coalesce(u.{name}, u.samples)" if name in _SAMPLE_COUNTS else f"u.{name}"
                  for name, _ in _MINUTE_VALUES)}
FROM gpu_minute_blocks b
CROSS JOIN LATERAL unnest(b.minute_ts, {", ".join(f"b.{name}" for name, _ in _MINUTE_VALUES)}) AS u(minute_ts, {_MINUTES})
ON CONFLICT (job_id, cluster, node, gpu_index, mig_uuid, ts) DO UPDATE SET
    {", ".join(f"{c} = g.{c} + excluded.{c}" for c in _ADDED)},
    {", ".join(f"{c} = greatest(g.{c}, excluded.{c})"
               for c in ("util_gpu_max", "mem_used_max", "mem_total_max", "energy_max", "last_ts"))},
    energy_min = least(g.energy_min, excluded.energy_min), first_ts = least(g.first_ts, excluded.first_ts),
    lost = g.lost OR excluded.lost
"""


def _packed_days(bind: sa.engine.Connection) -> list[dt.date]:
    rows = bind.execute(sa.text(
        """SELECT DISTINCT right(child.relname, 8) FROM pg_inherits
           JOIN pg_class parent ON parent.oid = pg_inherits.inhparent
           JOIN pg_class child ON child.oid = pg_inherits.inhrelid
           WHERE parent.relname IN ('gpu_sample_blocks', 'gpu_minute_blocks')"""
    )).fetchall()
    return sorted(dt.datetime.strptime(r[0], "%Y%m%d").date() for r in rows)


def downgrade() -> None:
    bind = op.get_bind()
    # A pass killed while packing a day leaves its trigger on the day's raw partitions: it would
    # refuse the rows put back below.
    stray = bind.execute(sa.text(
        """SELECT format('DROP TRIGGER %I ON %I', t.tgname, c.relname) FROM pg_trigger t
           JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname = 'jobsight_compacting'"""
    )).fetchall()
    for (statement,) in stray:
        bind.execute(sa.text(statement))
    for day in _packed_days(bind):
        for table in ("gpu_samples", "gpu_minutes"):
            bind.execute(sa.text(
                f"CREATE TABLE IF NOT EXISTS {table}_p{day:%Y%m%d} PARTITION OF {table} "
                f"FOR VALUES FROM ('{day.isoformat()} 00:00:00+00') "
                f"TO ('{(day + dt.timedelta(days=1)).isoformat()} 00:00:00+00')"
            ))
    bind.execute(sa.text(_UNPACK_SAMPLES))
    bind.execute(sa.text(_UNPACK_MINUTES))
    op.drop_table("gpu_minute_blocks")
    op.drop_table("gpu_sample_blocks")
    op.drop_table("gpu_sample_timelines")
    op.drop_index(op.f("ix_gpu_devices_gpu_uuid_gpu_index"), table_name="gpu_devices")
    op.drop_table("gpu_devices")
    op.execute("DROP FUNCTION jobsight_refuse_while_compacting()")
