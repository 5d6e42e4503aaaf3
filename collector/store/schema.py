"""The database schema as SQLAlchemy metadata.

Alembic (``migrations/``) is the only way the schema changes; this module is what
autogenerate compares the database against, and what the ingest path reads its
column lists from. Time-series tables are range-partitioned by ``ts``; their daily
partitions (``<table>_pYYYYMMDD``) are made by :mod:`jobsight.collector.store.partitions`.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Double,
    Float,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.types import UserDefinedType

from jobsight.collector.store.packed_params import (
    BYTE_TYPE,
    COUNTERS,
    HOST_PLANES,
    PLANES,
    STEPS,
    TIME_PLANES,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "pk": "pk_%(table_name)s",
    }
)

TS = DateTime(timezone=True)
PARTITION_BY = "RANGE (ts)"


class Byte(UserDefinedType[int]):
    """PostgreSQL's one-byte ``"char"`` (-128..127): the element of a packed block's byte planes."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return BYTE_TYPE


SERIES_KEY = ("cluster", "job_id", "ts", "node")
"""The columns of :func:`_series_keys`."""


def _series_keys() -> list[Column[Any]]:
    """Columns every time-series row carries: where it belongs and when."""
    return [
        Column("cluster", Text, nullable=False),
        Column("job_id", Text, nullable=False),
        Column("ts", TS, nullable=False),
        Column("node", Text),
    ]


jobs = Table(
    "jobs",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("user_name", Text),
    Column("uid", Integer),
    Column("account", Text),
    Column("partition", Text),
    Column("name", Text),
    Column("nodes", ARRAY(Text)),
    Column("node_count", Integer),
    Column("gpus", ARRAY(Text)),
    Column("time_limit_s", Integer),
    Column("start_time", TS),
    Column("end_time", TS),
    Column("state", Text, nullable=False, server_default=text("'running'")),
    Column("exit_code", Integer),
    Column("demo", Boolean, nullable=False, server_default=text("false")),
    Column("attrs", JSONB),
    Column("first_seen", TS, nullable=False, server_default=text("now()")),
    Column("last_seen", TS, nullable=False, server_default=text("now()")),
    # A requeued job's latest run (Slurm's restart count) and its start; NULL: run 0, from start_time.
    Column("run", Integer, nullable=False, server_default=text("0")),
    Column("run_start", TS),
    # From the prolog's squeue --json (job tokens cannot set them): what waste policies exempt by.
    Column("qos", Text),
    Column("comment", Text),
    Column("batch", Boolean),
    # Why jobsight ended the job ("jobsight: GPUs idle 2 h (policy gpu-idle)"), set by the actions pass
    # when its scancel or requeue went through: shown beside Slurm's end state on the page and in reports.
    Column("end_reason", Text),
    PrimaryKeyConstraint("cluster", "job_id"),
    Index(None, "state"),
    Index(None, "user_name"),
    Index(None, "start_time"),
)

gpu_samples = Table(
    "gpu_samples",
    metadata,
    *_series_keys(),
    Column("gpu_index", SmallInteger, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("gpu_name", Text),
    Column("mig_uuid", Text),
    Column("util_gpu", Float),
    Column("util_mem", Float),
    Column("mem_used", BigInteger),
    Column("mem_total", BigInteger),
    Column("power_w", Float),
    Column("energy_j", Double),
    Column("temp_c", Float),
    Column("sm_clock_mhz", Integer),
    Column("mem_clock_mhz", Integer),
    Column("pcie_tx_kbs", Integer),
    Column("pcie_rx_kbs", Integer),
    Column("throttle_reasons", BigInteger),
    Column("ecc_errors", BigInteger),
    Column("process_count", Integer),
    Column("sm_active", Float),
    Column("tensor_active", Float),
    Column("lost", Boolean),
    # What says why a GPU is slow or failing (records.GpuSample): the physical GPU's row only.
    Column("nvlink_crc_errors", BigInteger),
    Column("nvlink_replay_errors", BigInteger),
    Column("nvlink_recovery_errors", BigInteger),
    Column("pcie_replays", BigInteger),
    Column("remapped_rows_pending", Boolean),
    Column("remap_failure", Boolean),
    Column("retired_pages_pending", Boolean),
    Index(None, "job_id", "ts"),
    postgresql_partition_by=PARTITION_BY,
)

# What NVML reported about a GPU as it happened (records.GpuEvent: critical Xid errors), one row
# per event and job. Few rows (a healthy cluster has none), partitioned by day like the samples
# so that retention drops them with the samples they explain.
gpu_events = Table(
    "gpu_events",
    metadata,
    *_series_keys(),
    Column("gpu_index", SmallInteger, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("code", BigInteger, nullable=False),
    Index(None, "job_id", "ts"),
    postgresql_partition_by=PARTITION_BY,
)

def _gpu_rollup_columns() -> list[Column[Any]]:
    """The columns of a GPU rollup (gpu_minutes, gpu_hours): the key, then the sums, counts and
    extremes of the samples of one GPU in one period."""
    return [
        Column("cluster", Text, nullable=False),
        Column("job_id", Text, nullable=False),
        Column("ts", TS, nullable=False),
        Column("node", Text, nullable=False, server_default=text("''")),
        Column("gpu_index", SmallInteger, nullable=False),
        Column("mig_uuid", Text, nullable=False, server_default=text("''")),
        Column("gpu_uuid", Text, nullable=False),
        Column("samples", Integer, nullable=False),
        Column("util_gpu_sum", Double, nullable=False),
        Column("util_gpu_n", Integer, nullable=False),
        Column("util_gpu_max", Float),
        Column("util_idle_n", Integer, nullable=False),
        Column("util_mem_sum", Double, nullable=False),
        Column("util_mem_n", Integer, nullable=False),
        Column("mem_used_max", BigInteger),
        Column("mem_total_max", BigInteger),
        Column("power_sum", Double, nullable=False),
        Column("power_n", Integer, nullable=False),
        Column("temp_sum", Double, nullable=False),
        Column("temp_n", Integer, nullable=False),
        Column("energy_min", Double),
        Column("energy_max", Double),
        Column("energy_n", Integer, nullable=False),
        Column("first_ts", TS, nullable=False),
        Column("last_ts", TS, nullable=False),
        Column("lost", Boolean, nullable=False),
    ]


# Per GPU and wall-clock minute, sums and extremes of gpu_samples, kept up to date at
# ingest. A chart whose buckets are minutes or wider reads this instead of every sample:
# a 64-GPU, 24-hour job is 92 k rows here against 5.5 M at 1 Hz. Sums and counts (not
# means) so that batches arriving in any order add up to the same row.
gpu_minutes = Table(
    "gpu_minutes",
    metadata,
    *_gpu_rollup_columns(),
    Index("uq_gpu_minutes_key", "job_id", "cluster", "node", "gpu_index", "mig_uuid", "ts", unique=True),
    postgresql_partition_by=PARTITION_BY,
)

# gpu_minutes summed per UTC hour (``ts``), kept up to date at ingest from the same sums. A
# chart whose buckets are two hours or wider reads this: a 64-GPU, 9-day job is 14 k rows here
# against 830 k minutes. The compaction pass leaves it alone (it is ~0.03 B a sample), and its
# partitions are kept as long as the packed tier's (PACKED_RETENTION_TABLES).
gpu_hours = Table(
    "gpu_hours",
    metadata,
    *_gpu_rollup_columns(),
    Index("uq_gpu_hours_key", "job_id", "cluster", "node", "gpu_index", "mig_uuid", "ts", unique=True),
    postgresql_partition_by=PARTITION_BY,
)

# Per rank and wall-clock minute, sums and extremes of the training steps (``phase`` 'train'
# or none), kept up to date at ingest by collector/tiers/step_rollup.py: the job page's step charts
# read this instead of a row per step per rank (a 512-rank job at 2 steps a second writes 61 k
# step rows a minute, and 512 rows here). A step without a rank is stored under rank -1 (a key
# column cannot be NULL). Sums, counts and extremes, so that batches add up in any order.
step_minutes = Table(
    "step_minutes",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("ts", TS, nullable=False),
    Column("rank", Integer, nullable=False),
    Column("steps", Integer, nullable=False),
    Column("duration_sum", Double, nullable=False),
    Column("duration_max", Double, nullable=False),
    Column("data_wait_sum", Double),
    Column("samples_sum", BigInteger),
    Column("last_step", BigInteger, nullable=False),
    Column("epoch", Integer),
    Column("first_ts", TS, nullable=False),
    Column("last_ts", TS, nullable=False),
    Column("forward_sum", Double),
    Column("forward_n", Integer),
    Index("uq_step_minutes_key", "job_id", "cluster", "ts", "rank", unique=True),
    postgresql_partition_by=PARTITION_BY,
)

# When each training epoch of a job began: the earliest train step carrying that epoch, on any
# rank. Small (a row per epoch), so not partitioned; written only when a group brings an earlier
# start than the collector process knows of (collector/tiers/step_rollup.py).
epoch_starts = Table(
    "epoch_starts",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("ts", TS, nullable=False),
    PrimaryKeyConstraint("job_id", "cluster", "epoch"),
)

host_samples = Table(
    "host_samples",
    metadata,
    *_series_keys(),
    Column("cpu_util", Float),
    Column("cpu_time_s", Double),
    Column("mem_used", BigInteger),
    Column("mem_limit", BigInteger),
    Column("energy_j", Float),
    Column("power_source", Text),
    Column("energy_split", Text),
    Index(None, "job_id", "ts"),
    postgresql_partition_by=PARTITION_BY,
)

log_events = Table(
    "log_events",
    metadata,
    *_series_keys(),
    Column("rank", Integer),
    Column("pid", Integer),
    Column("tid", BigInteger),
    Column("thread", Text),
    Column("level", Text, nullable=False),
    Column("logger", Text),
    Column("message", Text, nullable=False),
    Column("exception", Text),
    Column("attrs", JSONB),
    Index(None, "job_id", "ts"),
    postgresql_partition_by=PARTITION_BY,
)

metrics = Table(
    "metrics",
    metadata,
    *_series_keys(),
    Column("rank", Integer),
    Column("pid", Integer),
    Column("step", BigInteger),
    Column("name", Text, nullable=False),
    Column("value", Double, nullable=False),
    Column("tid", BigInteger),
    Index(None, "job_id", "name", "ts"),
    postgresql_partition_by=PARTITION_BY,
)

steps = Table(
    "steps",
    metadata,
    *_series_keys(),
    Column("rank", Integer),
    Column("pid", Integer),
    Column("step", BigInteger, nullable=False),
    Column("epoch", Integer),
    Column("phase", Text),
    Column("duration_s", Double, nullable=False),
    Column("data_wait_s", Double),
    Column("compute_s", Double),
    Column("samples", Integer),
    Column("tid", BigInteger),
    Column("forward_s", Double),
    Index(None, "job_id", "ts"),
    postgresql_partition_by=PARTITION_BY,
)

profiles = Table(
    "profiles",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("ts", TS, nullable=False),
    Column("node", Text),
    Column("rank", Integer),
    Column("pid", Integer),
    Column("profile_id", Text, nullable=False),
    Column("request_id", BigInteger),
    Column("step_start", BigInteger),
    Column("step_end", BigInteger),
    Column("summary", JSONB, nullable=False),
    Column("diagnosis", JSONB),
    Column("trace_gz", LargeBinary),
    Column("note", Text),
    PrimaryKeyConstraint("job_id", "id"),
    Index(None, "job_id", "ts"),
)

job_runs = Table(
    # The earlier runs of a requeued job, closed when the next run starts (collector/jobs/job_runs.py).
    "job_runs",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("run", Integer, nullable=False),
    Column("start_time", TS),
    Column("end_time", TS),
    Column("state", Text),
    Column("exit_code", Integer),
    PrimaryKeyConstraint("cluster", "job_id", "run"),
)

job_summaries = Table(
    "job_summaries",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("computed_at", TS, nullable=False, server_default=text("now()")),
    Column("gpu_count", Integer),
    Column("gpu_hours", Double),
    Column("mean_util", Double),
    Column("energy_kwh", Double),
    Column("flags", ARRAY(Text)),
    Column("summary", JSONB, nullable=False),
    Column("node_energy_kwh", Double),
    Column("co2e_kg", Double),
    PrimaryKeyConstraint("cluster", "job_id"),
)

ingest_batches = Table(
    "ingest_batches",
    metadata,
    Column("source", Text, nullable=False),
    # Who sent it (collector/ingest/write_rights.py ``sender_of``): a batch id is unique per sender, so nobody can
    # make another's batch a duplicate. ``*``: stored before senders were recorded, any sender.
    Column("sender", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("cluster", Text, nullable=False),
    Column("records", Integer, nullable=False),
    Column("received_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("source", "sender", "seq"),
    Index(None, "received_at"),
)

# Processes on a GPU that no job was given, as the node daemons report them (gpu_unallocated_use
# records, collector/ingest/unallocated_uses.py), for the admins: no job_id, since they belong to no
# job. On Citus it is distributed by node (collector/store/citus.py), which every key holds.
gpu_unallocated_uses = Table(
    "gpu_unallocated_uses",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("node", Text, nullable=False),
    Column("ts", TS, nullable=False),
    Column("gpu_index", SmallInteger, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("uid", Integer),
    Column("mem_used", BigInteger),
    Column("received_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("node", "cluster", "gpu_index", "ts", "pid"),
    Index(None, "ts"),
)

profile_requests = Table(
    "profile_requests",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    Column("updated_at", TS, nullable=False, server_default=text("now()")),
    Column("requested_by", Text),
    Column("steps", Integer, nullable=False),
    Column("ranks", ARRAY(Integer)),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    Column("reason", Text),
    Column("profile_id", Text),
    PrimaryKeyConstraint("job_id", "id"),
    Index(None, "job_id", "state"),
)

# What the health rules (jobsight/rules/health.py) noticed, by collector/passes/findings.py. A
# finding is keyed by (job, rule, subject): at most one open at a time (the partial unique index),
# so a restarted evaluator updates the open one instead of opening it again; a resolved one stays
# as history, and the same condition later opens a new row.
findings = Table(
    "findings",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("rule", Text, nullable=False),
    # What it is about within the job: '' for the whole job, 'rank 3', 'gpu node1/0'.
    Column("subject", Text, nullable=False, server_default=text("''")),
    Column("rank", Integer),
    Column("node", Text),
    Column("gpu", Text),
    Column("severity", Text, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'open'")),
    Column("opened_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    Column("resolved_at", TS),
    Column("at_ts", TS),
    Column("title", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("evidence", JSONB, nullable=False),
    PrimaryKeyConstraint("job_id", "id"),
    Index("uq_findings_open", "job_id", "cluster", "rule", "subject", unique=True,
          postgresql_where=text("state = 'open'")),
    Index(None, "state"),
)


# One row per step a waste policy took (or, dry, would have taken) for one open finding: warnings,
# the action, an exemption, a held-back action (the hourly cap). Unique per finding, policy and step,
# so a restarted pass neither repeats nor skips one (collector/passes/actions.py).
actions = Table(
    "actions",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("finding_id", BigInteger, nullable=False),
    Column("policy", Text, nullable=False),
    Column("rule", Text, nullable=False),
    Column("step", Text, nullable=False),
    Column("at", TS, nullable=False),
    Column("dry_run", Boolean, nullable=False),
    # recorded (a warning, an exemption, any dry step), pending (an action about to run), done,
    # failed (the command said no; detail says why), held_back (over the hourly cap; tried again).
    Column("outcome", Text, nullable=False),
    Column("detail", Text, nullable=False, server_default=text("''")),
    Column("evidence", JSONB, nullable=False),
    PrimaryKeyConstraint("job_id", "id"),
    Index("uq_actions_step", "job_id", "cluster", "finding_id", "policy", "step", unique=True),
    Index(None, "at"),
)

# Messages to people that are not findings' alerts: a waste policy's warnings and actions, a job's
# end-of-job summary, the periodic reports per user and per account sponsor (collector/passes/notices.py).
# Composed when enqueued (``title`` and ``lines``, a JSON list of lines, each a list of text pieces and
# ``{"link": url}``), sent by the notice sender with the alerts' retries. ``key`` makes a second enqueue
# of the same notice a no-op; ``job_id`` is '' for a periodic report (it is about many jobs).
notices = Table(
    "notices",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("sink", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("title", Text, nullable=False),
    Column("lines", JSONB, nullable=False),
    Column("notify_type", Text, nullable=False, server_default=text("'info'")),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    Column("next_try_at", TS, nullable=False, server_default=text("now()")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("sent_at", TS),
    Column("last_error", Text),
    PrimaryKeyConstraint("job_id", "id"),
    Index("uq_notices_key", "job_id", "key", "sink", unique=True),
    Index("ix_notices_unsent", "next_try_at", postgresql_where=text("sent_at IS NULL")),
)

# Alerts to send, written in the transaction that opens or resolves a finding (a transactional
# outbox): a collector killed before sending finds the row after restart, and ``sent_at`` is set
# once it went, so it is not sent twice. One row per finding, event and sink.
alert_outbox = Table(
    "alert_outbox",
    metadata,
    Column("id", BigInteger, Identity(), nullable=False),
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("finding_id", BigInteger, nullable=False),
    Column("event", Text, nullable=False),
    Column("sink", Text, nullable=False),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    Column("next_try_at", TS, nullable=False, server_default=text("now()")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("sent_at", TS),
    Column("last_error", Text),
    PrimaryKeyConstraint("job_id", "id"),
    Index("uq_alert_outbox_event", "job_id", "finding_id", "event", "sink", unique=True),
    Index("ix_alert_outbox_unsent", "next_try_at", postgresql_where=text("sent_at IS NULL")),
)

# The packed tier. A closed hour of gpu_samples and gpu_minutes is rewritten by the compaction
# pass (collector/tiers/compaction.py) into the three tables below and its raw rows removed;
# collector/tiers/reads.py reads both tiers as one. docs/format/packed.md specifies the blocks'
# format, collector/store/packed_params.py holds its numbers, collector/tiers/packed_format.py
# encodes it. Every key holds job_id (the distribution column on Citus); gpu_devices is a small
# dictionary (a reference table there).

# One row per distinct (node, GPU index, UUID, name, MIG device) ever packed, so a packed
# block names its GPU by a 4-byte id instead of repeating ~80 bytes of text. Only the
# compaction pass writes it, one pass at a time (an advisory lock), which is what keeps the
# tuples unique (UNIQUE would not, as PostgreSQL 14 treats NULLs as distinct).
gpu_devices = Table(
    "gpu_devices",
    metadata,
    Column("id", Integer, Identity(), nullable=False),
    Column("node", Text),
    Column("gpu_index", SmallInteger, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("gpu_name", Text),
    Column("mig_uuid", Text),
    PrimaryKeyConstraint("id"),
    Index(None, "gpu_uuid", "gpu_index"),
)

def _time_planes() -> list[Column[Any]]:
    """A packed block's sample times (docs/format/packed.md): since migration 0018 the seconds into
    its hour and the microseconds into the second as byte planes, ``sample_ts`` NULL; before, and
    for times outside the hour, the times themselves in ``sample_ts``."""
    return [Column("sample_ts", ARRAY(TS)), *(Column(plane, ARRAY(Byte())) for plane in TIME_PLANES)]


# The sample times of packed blocks, one array per distinct set of times in a job-hour. The
# node daemon stamps every GPU of a node with the same tick, so the 8 GPUs of a node share one
# timeline row: the times are stored once per node, not once per GPU.
gpu_sample_timelines = Table(
    "gpu_sample_timelines",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("ts", TS, nullable=False),
    Column("timeline", Integer, nullable=False),
    *_time_planes(),
    PrimaryKeyConstraint("job_id", "cluster", "ts", "timeline"),
    postgresql_partition_by=PARTITION_BY,
)

def _byte_planes(name: str, planes: int) -> list[Column[Any]]:
    """``<name>_base`` (int4 or int8) and ``<name>_p0``... one ``"char"[]`` per byte of the value."""
    base = Integer if planes == 4 else BigInteger
    return [Column(f"{name}_base", base), *(Column(f"{name}_p{k}", ARRAY(Byte())) for k in range(planes))]


# gpu_samples packed: one row per job, GPU (gpu_devices.id) and UTC hour (``ts``), each
# measurement in timeline order (docs/format/packed.md, the numbers in store/packed_params.py).
# Since migration 0015 a measurement is kept as integers (whole percents and degrees, W in mW, J in
# mJ; GPM ratios in hundredths of a point, rounded) XORed with the block's ``<name>_base`` and cut
# into byte planes ``<name>_p0``..., a plane of zeros not stored; as float8 in its ``_f`` twin
# when one value of the block is not such an integer. The arrays before them (``util_gpu``,
# ``power_mw``, ``energy_mj``...) are the format of blocks packed before 0015: read, never written.
# Large arrays are compressed by TOAST (pglz) and stored out of line.
gpu_sample_blocks = Table(
    "gpu_sample_blocks",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("ts", TS, nullable=False),
    Column("device", Integer, nullable=False),
    Column("timeline", Integer, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("first_ts", TS, nullable=False),
    Column("last_ts", TS, nullable=False),
    Column("util_gpu", ARRAY(SmallInteger)),
    Column("util_gpu_f", ARRAY(Double)),
    Column("util_mem", ARRAY(SmallInteger)),
    Column("util_mem_f", ARRAY(Double)),
    Column("mem_used", ARRAY(BigInteger)),
    Column("mem_total", ARRAY(BigInteger)),
    Column("power_mw", ARRAY(Integer)),
    Column("power_w_f", ARRAY(Double)),
    Column("energy_mj_base", BigInteger),
    Column("energy_mj", ARRAY(Integer)),
    Column("energy_j_f", ARRAY(Double)),
    Column("temp_c", ARRAY(SmallInteger)),
    Column("temp_c_f", ARRAY(Double)),
    Column("sm_clock_mhz", ARRAY(Integer)),
    Column("mem_clock_mhz", ARRAY(Integer)),
    Column("pcie_tx_kbs", ARRAY(Integer)),
    Column("pcie_rx_kbs", ARRAY(Integer)),
    Column("throttle_reasons", ARRAY(BigInteger)),
    Column("ecc_errors", ARRAY(BigInteger)),
    Column("process_count", ARRAY(Integer)),
    Column("sm_active", ARRAY(SmallInteger)),
    Column("sm_active_f", ARRAY(Double)),
    Column("tensor_active", ARRAY(SmallInteger)),
    Column("tensor_active_f", ARRAY(Double)),
    Column("lost", ARRAY(Boolean)),
    Column("nvlink_crc_errors", ARRAY(BigInteger)),
    Column("nvlink_replay_errors", ARRAY(BigInteger)),
    Column("nvlink_recovery_errors", ARRAY(BigInteger)),
    Column("pcie_replays", ARRAY(BigInteger)),
    Column("remapped_rows_pending", ARRAY(Boolean)),
    Column("remap_failure", ARRAY(Boolean)),
    Column("retired_pages_pending", ARRAY(Boolean)),
    *(column for name, planes in PLANES.items() for column in _byte_planes(name, planes)),
    *(Column(f"{name}_step", SmallInteger) for name in STEPS),
    *(Column(f"{name}_first", BigInteger) for name in COUNTERS),
    PrimaryKeyConstraint("job_id", "cluster", "ts", "device"),
    postgresql_partition_by=PARTITION_BY,
)

MINUTE_KEY = ("cluster", "job_id", "ts", "node", "gpu_index", "mig_uuid")
"""gpu_minutes' key columns; the rest are the rollup's values."""

SAMPLE_COUNTS = ("util_gpu_n", "util_mem_n", "power_n", "temp_n", "energy_n")
"""Rollup counts that equal ``samples`` whenever every sample carries the measurement."""

# gpu_minutes packed: one row per job, GPU and UTC hour; each rollup column an array over the
# hour's minutes (``minute_ts``), the values copied as they were. A count of SAMPLE_COUNTS that
# equals ``samples`` in every minute of the block is NULL (read as ``samples``): the common case
# costs neither bytes nor, when read, an array to unnest.
gpu_minute_blocks = Table(
    "gpu_minute_blocks",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("ts", TS, nullable=False),
    Column("node", Text, nullable=False),
    Column("gpu_index", SmallInteger, nullable=False),
    Column("mig_uuid", Text, nullable=False),
    Column("minute_ts", ARRAY(TS), nullable=False),
    *(Column(c.name, ARRAY(c.type), nullable=c.name in SAMPLE_COUNTS)
      for c in gpu_minutes.columns if c.name not in MINUTE_KEY),
    PrimaryKeyConstraint("job_id", "cluster", "ts", "node", "gpu_index", "mig_uuid"),
    postgresql_partition_by=PARTITION_BY,
)

# host_samples packed: one row per job, node and UTC hour (``ts``), the sample times and each
# measurement in time order (NULL elements included), so a packed sample reads back exactly.
# Since migration 0016 the CPU and memory columns are byte planes of integers, as a GPU block's
# (docs/format/packed.md); the arrays named as the columns hold a block's floats that
# are no such integers, and every column of the blocks packed before. ``block`` numbers the nodes
# of a job-hour: ``node`` may be NULL, which a primary key cannot hold.
_HOST_LATER = ("energy_j", "power_source", "energy_split")
host_sample_blocks = Table(
    "host_sample_blocks",
    metadata,
    Column("cluster", Text, nullable=False),
    Column("job_id", Text, nullable=False),
    Column("ts", TS, nullable=False),
    Column("block", Integer, nullable=False),
    Column("node", Text),
    Column("samples", Integer, nullable=False),
    Column("first_ts", TS, nullable=False),
    Column("last_ts", TS, nullable=False),
    *_time_planes(),
    # The node energy columns came later (migration 0014): blocks packed before have none.
    *(Column(c.name, ARRAY(c.type), nullable=c.name in _HOST_LATER or c.name in HOST_PLANES)
      for c in host_samples.columns if c.name not in SERIES_KEY),
    *(column for name, planes in HOST_PLANES.items() for column in _byte_planes(name, planes)),
    PrimaryKeyConstraint("job_id", "cluster", "ts", "block"),
    postgresql_partition_by=PARTITION_BY,
)

PARTITIONED_TABLES = (
    "gpu_samples", "gpu_minutes", "gpu_hours", "host_samples", "log_events", "metrics", "steps", "step_minutes",
    "gpu_events",
)
"""Partitions made ahead by the collector and on demand by the ingest path."""
PACKED_TABLES = ("gpu_sample_blocks", "gpu_sample_timelines", "gpu_minute_blocks", "host_sample_blocks")
"""Partitioned by day like the raw tables, but made only by the compaction pass."""
PACKED_RETENTION_TABLES = (*PACKED_TABLES, "gpu_hours")
"""Dropped past the packed tier's retention, by the compaction pass. gpu_hours is made like the
raw tables but kept as long as the packed minutes it sums: it is what a long job's page reads."""
RETENTION_TABLES = tuple(t for t in PARTITIONED_TABLES if t not in PACKED_RETENTION_TABLES)
"""Dropped past ``JOBSIGHT_RETENTION_DAYS``."""

_PARTITION_NAME = re.compile(r"_p\d{8}$")


def compare_type(
    context: object, inspected: object, column: object, inspected_type: Any, metadata_type: Any
) -> bool | None:
    """Alembic type comparison: SQLAlchemy reflects ``"char"[]`` (:class:`Byte`) as an array of
    strings, which is that type; every other column is compared as Alembic does (None)."""
    if isinstance(metadata_type, ARRAY) and isinstance(metadata_type.item_type, Byte):
        return not (isinstance(inspected_type, ARRAY) and isinstance(inspected_type.item_type, String))
    return None


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic filter: daily partitions and their indexes belong to the collector."""
    return not (type_ in ("table", "index") and name is not None and _PARTITION_NAME.search(name))
