"""The shape of every record kind, declared once.

:class:`Common` holds what every record of a job carries (:class:`NodeCommon`, what a record about
a node carries: no job, see :data:`NODE_KINDS`); each kind's own fields are one dataclass
here, and :data:`RECORDS` names the kind each one is on the wire. Everything else follows
from these classes: :mod:`jobsight.protocol.wire` derives its validation table
(``wire.FIELDS``) from their annotations, the agent's ``GpuReading`` is :class:`GpuSample`
plus what the node daemon keeps for itself, and ``tests/protocol/test_record_shapes.py``
holds the collector's tables to them.

How a field's annotation becomes its wire spec (see ``specs.spec_of``):

* ``str`` -> ``"str"`` (a short string, at most ``wire.MAX_STRING`` characters);
  :data:`Text` -> ``"text"`` (a long one, up to ``wire.MAX_MESSAGE``);
* ``int``, ``float``, ``bool`` -> their own names; :data:`Json` -> ``"json"`` (any JSON value);
* ``list[str]`` -> ``"str_list"``, ``list[int]`` -> ``"int_list"``;
* ``X | None`` -> the spec of ``X`` with a trailing ``"?"``: the field may be absent or null.
  Such a field defaults to ``None`` here; a required one has no default.

What values a field takes is declared here too, with ``Annotated`` markers the validator reads:

* :class:`Range`: the inclusive bounds of an ``int`` or ``float`` field. An integer's are those
  of the PostgreSQL column it lands in (:data:`Int2`, :data:`Int4`, :data:`Int8`; see
  ``collector/store/schema.py``, and ``tests/protocol/test_record_shapes.py``, which holds the two
  together). A float column (float8) takes any finite number, but PostgreSQL adds some of
  them up (the per-minute GPU rollup, averages on the charts): those fields get physical
  bounds, so that no sum of stored values can overflow a float8. A bare ``int`` is an int8,
  a bare ``float`` any finite number.
* :class:`Content`: what a value must hold beyond its type (a gzip stream, a JSON object).

A field's place in its class is its place in validation, which decides the field that
a record breaking several rules is rejected for; append new fields at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final


@dataclass(frozen=True)
class WireSpec:
    """Marks an ``Annotated`` type whose wire spec is not its Python type's name."""

    spec: str


@dataclass(frozen=True)
class Range:
    """Marks the inclusive bounds of an ``int`` or ``float`` field (see the module docstring)."""

    lo: int | float
    hi: int | float


@dataclass(frozen=True)
class Content:
    """Marks what a value must hold beyond its type; ``wire`` has one check per name."""

    name: str


# The PostgreSQL integer columns: smallint, integer, bigint.
Int16: Final = Range(-(2**15), 2**15 - 1)
Int32: Final = Range(-(2**31), 2**31 - 1)
Int64: Final = Range(-(2**63), 2**63 - 1)
Int2 = Annotated[int, Int16]
"""An integer stored in a ``smallint`` column."""
Int4 = Annotated[int, Int32]
"""An integer stored in an ``integer`` column."""
Int8 = Annotated[int, Int64]
"""An integer stored in a ``bigint`` column (or not stored as a column at all)."""
Rank = Annotated[int, Range(0, 2**31 - 1)]
"""A process's rank in its job (``torch.distributed``'s, from 0): never negative, so that the
rollups can key "no rank" as -1."""

# Physical bounds of the floats PostgreSQL sums (collector/tiers/rollup.py, collector/jobs/summaries.py,
# the charts' averages): wide enough for any real reading, narrow enough that adding up
# every sample any batch can carry stays far inside a float8.
Percent = Annotated[float, Range(0.0, 100.0)]
Celsius = Annotated[float, Range(-273.0, 1000.0)]
Watts = Annotated[float, Range(0.0, 100_000.0)]
Joules = Annotated[float, Range(0.0, 1e15)]
"""A counter since the driver loaded: 1e15 J is a 1 MW machine running for 30 years."""
Seconds = Annotated[float, Range(0.0, 1e9)]
"""A duration: 1e9 s is 31 years."""
CpuPercent = Annotated[float, Range(0.0, 100_000.0)]
"""Percent of one CPU: 100000 is a thousand busy cores."""
CpuSeconds = Annotated[float, Range(0.0, 1e12)]
"""CPU time of a job on one node, all its cores together: 1e12 s is a thousand cores for 31 years."""

Text = Annotated[str, WireSpec("text")]
"""A string that may be long (a log message, a traceback): capped at ``wire.MAX_MESSAGE``."""
Json = Annotated[Any, WireSpec("json")]
"""Any JSON value; strings inside are capped like :data:`Text`."""
JsonObject = Annotated[Any, WireSpec("json"), Content("object")]
"""A JSON object (a profile's summary)."""
Hints = Annotated[Any, WireSpec("json"), Content("hints")]
"""A list of diagnosis hints (:mod:`jobsight.protocol.diagnosis`): objects, each with a string ``rule``."""
GzipBase64 = Annotated[str, WireSpec("text"), Content("gzip_base64")]
"""Base64 of one gzip stream and nothing after it (a profiler trace): capped at ``wire.MAX_TRACE_B64``
characters, and at ``wire.MAX_TRACE_INFLATED`` bytes once inflated."""
Sluid = Annotated[str, WireSpec("str"), Content("sluid")]
"""A job run's SLUID as slurmd prints it (``s8FXKTA79XAR00``: :mod:`jobsight.protocol.sluid`)."""


@dataclass(kw_only=True)
class Common:
    """The fields every record starts with, whatever its kind."""

    kind: str
    """One of the keys of :data:`RECORDS`."""
    job: str
    """The Slurm job id, or ``local-<host>-<pid>-<start>`` outside Slurm: an id
    :func:`jobsight.protocol.slurm_ids.is_job_id` takes (the wire refuses any other)."""
    ts: Int8
    """Microseconds since the Unix epoch, UTC."""
    node: str | None = None
    """The host the record was taken on."""


@dataclass(kw_only=True)
class NodeCommon:
    """What a record about a node rather than a job starts with, instead of :class:`Common`: it
    carries no ``job`` (a ``job`` field is refused), and ``node`` is required. Kinds in
    :data:`NODE_KINDS`."""

    kind: str
    """One of :data:`NODE_KINDS`."""
    ts: Int8
    """Microseconds since the Unix epoch, UTC."""
    node: str
    """The node the record speaks of; a node token writes only its own node's."""


# Not keyword-only, unlike the other kinds: its required fields lead, and the node daemon
# builds GpuReading (this plus its own fields) positionally.
@dataclass
class GpuSample:
    """One GPU (or one MIG device) at one tick. ``None`` means NVML could not give
    the value: not supported by this GPU or driver, or it failed this tick."""

    gpu_index: Int2
    gpu_uuid: str
    """The physical GPU's UUID; empty only for a GPU lost before it could be named."""
    gpu_name: str | None = None
    mig_uuid: str | None = None
    """Set on a MIG device's row; the physical GPU's own row has ``None``."""
    util_gpu: Percent | None = None
    """Percent of the last sample period a kernel was running."""
    util_mem: Percent | None = None
    """Percent of the last sample period device memory was read or written."""
    mem_used: Int8 | None = None
    """Bytes."""
    mem_total: Int8 | None = None
    """Bytes."""
    power_w: Watts | None = None
    energy_j: Joules | None = None
    """Energy since the driver was loaded, in joules."""
    temp_c: Celsius | None = None
    sm_clock_mhz: Int4 | None = None
    mem_clock_mhz: Int4 | None = None
    pcie_tx_kbs: Int4 | None = None
    pcie_rx_kbs: Int4 | None = None
    throttle_reasons: Int8 | None = None
    """NVML's clock event (throttle) reason bit mask."""
    ecc_errors: Int8 | None = None
    """Volatile *uncorrected* ECC errors since the driver was loaded (corrected
    errors are routine on HBM and are not counted)."""
    process_count: Int4 | None = None
    """Compute processes on this device."""
    sm_active: Percent | None = None
    """GPM SM utilisation, percent, over the last tick; ``None`` without GPM
    (pre-Hopper, MIG devices, or the first tick)."""
    tensor_active: Percent | None = None
    """GPM tensor-core utilisation, percent, like ``sm_active``."""
    lost: bool | None = False
    """The GPU fell off the bus; every measurement is ``None``. Optional on the wire
    (absent from older agents' records), always set by this one."""
    # What says why a GPU is slow or about to fail, read on the physical GPU's row only (a MIG
    # device's row has ``None``: the links, the bus and the memory are the whole GPU's). Counters
    # count since the driver loaded, so a rise between samples is what happened in between.
    nvlink_crc_errors: Int8 | None = None
    """NVLink CRC errors (flow-control flits and data) summed over the GPU's links: a link that
    keeps counting them retransmits, and collectives over it slow down. ``None`` without NVLink
    (PCIe cards), or when one of its links could not be read this tick."""
    nvlink_replay_errors: Int8 | None = None
    """NVLink replays (packets sent again) summed over the links, like ``nvlink_crc_errors``."""
    nvlink_recovery_errors: Int8 | None = None
    """NVLink recoveries (a link retrained after a fault) summed over the links, like
    ``nvlink_crc_errors``: traffic stalls while one lasts."""
    pcie_replays: Int8 | None = None
    """PCIe replays: packets the GPU's PCIe link sent again (a marginal riser, slot or cable)."""
    remapped_rows_pending: bool | None = None
    """A memory row remap waits for the GPU's next reset (A100 and later): until then the bad row
    is in use, and uncorrectable errors may recur."""
    remap_failure: bool | None = None
    """A row could not be remapped (no spare left): the GPU needs service."""
    retired_pages_pending: bool | None = None
    """A memory page waits to be retired at the next driver reload (page retirement: before A100)."""


@dataclass(kw_only=True)
class GpuEvent:
    """Something NVML reported about a GPU as it happened: a critical Xid error. The node daemon
    gathers these between samples (NVML's event set), stamps each with the tick it read it at and
    sends it for every job its GPU's samples go to."""

    gpu_index: Int2
    gpu_uuid: str
    event: str
    """What happened: ``xid`` (``nvmlEventTypeXidCriticalError``), the only kind sent so far."""
    code: Int8
    """The Xid number (79: the GPU fell off the bus; 48: a double-bit ECC error; 94/95: a
    contained/uncontained memory error; 13, 31, 43: errors of the application's own)."""


@dataclass(kw_only=True)
class HostSample:
    """One job's CPU and memory use on one node at one tick."""

    cpu_util: CpuPercent | None = None
    """Percent of one CPU since the previous reading (200 = two cores busy)."""
    cpu_time_s: CpuSeconds | None = None
    """CPU seconds the job has used."""
    mem_used: Int8 | None = None
    """Bytes."""
    mem_limit: Int8 | None = None
    """Bytes."""
    energy_j: Joules | None = None
    """The job's share of what the node used besides its GPUs since the job's previous sample:
    CPUs and memory (``rapl``) or the whole node less its GPUs (``ipmi``, ``redfish``)."""
    power_source: str | None = None
    """Where the node's power came from: ``rapl``, ``ipmi`` or ``redfish``; absent: no node source."""
    energy_split: str | None = None
    """How the node's energy was split across its jobs: ``cpu_time+idle_cores`` (by CPU time, the
    idle part by allocated cores) or ``cpu_time`` (the idle part unassigned)."""


@dataclass(kw_only=True)
class Log:
    """One log line of a training process."""

    rank: Rank | None = None
    pid: Int4 | None = None
    tid: Int8 | None = None
    thread: str | None = None
    level: str
    logger: str | None = None
    message: Text
    exception: Text | None = None
    """The formatted traceback, if the line carried one."""
    attrs: Json | None = None


@dataclass(kw_only=True)
class Metric:
    """One named value a training process reported."""

    rank: Rank | None = None
    pid: Int4 | None = None
    tid: Int8 | None = None
    step: Int8 | None = None
    name: str
    value: Annotated[float, Range(-1e140, 1e140)]
    """Any finite number within ±1e140: charts average a bucket's values, and PostgreSQL's
    ``avg`` keeps the sum of squares, which a larger value would overflow."""


@dataclass(kw_only=True)
class Step:
    """One training step and where its time went."""

    rank: Rank | None = None
    pid: Int4 | None = None
    tid: Int8 | None = None
    step: Int8
    epoch: Int4 | None = None
    phase: str | None = None
    duration_s: Seconds
    data_wait_s: Seconds | None = None
    compute_s: Seconds | None = None
    samples: Int4 | None = None
    forward_s: Seconds | None = None
    """From the batch's arrival to the start of backward (forward pass and loss): the rank's own
    work, before data-parallel training's gradient all-reduce can make it wait for other ranks.
    The straggler rule compares it across ranks, where step times are all alike. ``None`` where
    the integration cannot see backward start."""


@dataclass(kw_only=True)
class Profile:
    """A profiler capture of a few steps: its summary and, optionally, the trace itself."""

    rank: Rank | None = None
    pid: Int4 | None = None
    profile_id: str
    request_id: Int8 | None = None
    """The on-demand request this profile answers, if any."""
    step_start: Int8 | None = None
    step_end: Int8 | None = None
    summary: JsonObject
    diagnosis: Hints | None = None
    trace_gz_b64: GzipBase64 | None = None
    """The gzip-compressed Chrome trace in base64, with caps of its own (:data:`GzipBase64`)."""
    note: str | None = None


@dataclass(kw_only=True)
class JobStarted:
    """A job's metadata, from a Slurm prolog or the training process's run metadata."""

    user: str | None = None
    uid: Int4 | None = None
    account: str | None = None
    partition: str | None = None
    name: str | None = None
    nodes: list[str] | None = None
    node_count: Int4 | None = None
    gpus: list[str] | None = None
    """The job's GPU indices on the sending node; the collector prefixes them with ``node``."""
    time_limit_s: Int4 | None = None
    demo: bool | None = None
    attrs: Json | None = None
    run: Int4 | None = None
    """Which run of a requeued job this is (Slurm's ``SLURM_JOB_RESTART_COUNT``: 0, then 1, ...);
    a higher run than the job's starts a new one. ``None`` (run metadata): the job's current run."""
    qos: str | None = None
    """Slurm's QOS of the job (the prolog's, from ``squeue --json``)."""
    comment: str | None = None
    """The job's Slurm comment, as its user wrote it: data, matched by the site's exemption word only."""
    batch: bool | None = None
    """``False`` for a job Slurm runs without a batch script (``salloc``, ``srun --pty``): interactive."""
    sluid: Sluid | None = None
    """The run's SLUID (Slurm 26.05 and later give the prolog ``SLURM_JOB_SLUID``; older Slurm none): the
    name of its cgroup v2 folder. Kept in the job's ``attrs`` as ``sluid`` (the latest run's)."""


@dataclass(kw_only=True)
class JobEnded:
    """The end of a job, from a Slurm epilog or the training process."""

    exit_code: Int4 | None = None
    state: str | None = None
    run: Int4 | None = None
    """The run that ended (see :class:`JobStarted`); an earlier run's end does not end a later run."""


@dataclass(kw_only=True)
class Dropped:
    """Records the agent had to throw away."""

    count: Int8
    reason: str | None = None


@dataclass(kw_only=True)
class GpuUnallocatedUse:
    """A process on a GPU that no job on the node was given (no registration names the GPU), and
    that belongs to no job registered on the node: a use of the GPU outside any job, for the
    admins. The node daemon sends one per such process, at most once a minute per GPU while the use
    lasts. It names no job: what a process says of itself (its ``SLURM_JOB_ID``) is no evidence,
    and a job id it chose must never reach a job's telemetry or a Slurm command."""

    gpu_index: Int2
    gpu_uuid: str
    """The physical GPU's UUID."""
    pid: Int4
    """The process, as the node's kernel numbers it."""
    uid: Int4 | None = None
    """Its real uid (``/proc/<pid>/status``); ``None`` when it could not be read (it exited)."""
    mem_used: Int8 | None = None
    """Bytes of GPU memory NVML says it uses; ``None`` when NVML does not say."""


# The kinds on the wire, in the order wire.KINDS lists them.
RECORDS: Final[dict[str, type[Any]]] = {
    "gpu_sample": GpuSample,
    "host_sample": HostSample,
    "log": Log,
    "metric": Metric,
    "step": Step,
    "profile": Profile,
    "job_started": JobStarted,
    "job_ended": JobEnded,
    "dropped": Dropped,
    "gpu_event": GpuEvent,
    "gpu_unallocated_use": GpuUnallocatedUse,
}

NODE_KINDS: Final = frozenset({"gpu_unallocated_use"})
"""The kinds about a node rather than a job: they start with :class:`NodeCommon` (no ``job``)."""


def common_of(kind: str) -> type[Any]:
    """The fields a record of ``kind`` starts with: :class:`NodeCommon` or :class:`Common`."""
    return NodeCommon if kind in NODE_KINDS else Common
