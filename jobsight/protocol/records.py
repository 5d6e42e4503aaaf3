"""The shape of every record kind, declared once.

:class:`Common` holds what every record carries; each kind's own fields are one dataclass
here, and :data:`RECORDS` names the kind each one is on the wire. Everything else follows
from these classes: :mod:`jobsight.protocol.wire` derives its validation table
(``wire.FIELDS``) from their annotations, the agent's ``GpuReading`` is :class:`GpuSample`
plus what the node daemon keeps for itself, and ``tests/protocol/test_record_shapes.py``
holds the collector's tables to them.

How a field's annotation becomes its wire spec (see ``wire.spec_of``):

* ``str`` -> ``"str"`` (a short string, at most ``wire.MAX_STRING`` characters);
  :data:`Text` -> ``"text"`` (a long one, up to ``wire.MAX_MESSAGE``);
* ``int``, ``float``, ``bool`` -> their own names; :data:`Json` -> ``"json"`` (any JSON value);
* ``list[str]`` -> ``"str_list"``, ``list[int]`` -> ``"int_list"``;
* ``X | None`` -> the spec of ``X`` with a trailing ``"?"``: the field may be absent or null.
  Such a field defaults to ``None`` here; a required one has no default.

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


Text = Annotated[str, WireSpec("text")]
"""A string that may be long (a log message, a traceback): capped at ``wire.MAX_MESSAGE``."""
Json = Annotated[Any, WireSpec("json")]
"""Any JSON value; strings inside are capped like :data:`Text`."""


@dataclass(kw_only=True)
class Common:
    """The fields every record starts with, whatever its kind."""

    kind: str
    """One of the keys of :data:`RECORDS`."""
    job: str
    """The Slurm job id, or ``local-<host>-<pid>-<start>`` outside Slurm."""
    ts: int
    """Microseconds since the Unix epoch, UTC."""
    node: str | None = None
    """The host the record was taken on."""


# Not keyword-only, unlike the other kinds: its required fields lead, and the node daemon
# builds GpuReading (this plus its own fields) positionally.
@dataclass
class GpuSample:
    """One GPU (or one MIG device) at one tick. ``None`` means NVML could not give
    the value: not supported by this GPU or driver, or it failed this tick."""

    gpu_index: int
    gpu_uuid: str
    """The physical GPU's UUID; empty only for a GPU lost before it could be named."""
    gpu_name: str | None = None
    mig_uuid: str | None = None
    """Set on a MIG device's row; the physical GPU's own row has ``None``."""
    util_gpu: float | None = None
    """Percent of the last sample period a kernel was running."""
    util_mem: float | None = None
    """Percent of the last sample period device memory was read or written."""
    mem_used: int | None = None
    """Bytes."""
    mem_total: int | None = None
    """Bytes."""
    power_w: float | None = None
    energy_j: float | None = None
    """Energy since the driver was loaded, in joules."""
    temp_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    pcie_tx_kbs: int | None = None
    pcie_rx_kbs: int | None = None
    throttle_reasons: int | None = None
    """NVML's clock event (throttle) reason bit mask."""
    ecc_errors: int | None = None
    """Volatile *uncorrected* ECC errors since the driver was loaded (corrected
    errors are routine on HBM and are not counted)."""
    process_count: int | None = None
    """Compute processes on this device."""
    sm_active: float | None = None
    """GPM SM utilisation, percent, over the last tick; ``None`` without GPM
    (pre-Hopper, MIG devices, or the first tick)."""
    tensor_active: float | None = None
    """GPM tensor-core utilisation, percent, like ``sm_active``."""
    lost: bool | None = False
    """The GPU fell off the bus; every measurement is ``None``. Optional on the wire
    (absent from older agents' records), always set by this one."""


@dataclass(kw_only=True)
class HostSample:
    """One job's CPU and memory use on one node at one tick."""

    cpu_util: float | None = None
    """Percent of one CPU since the previous reading (200 = two cores busy)."""
    cpu_time_s: float | None = None
    """CPU seconds the job has used."""
    mem_used: int | None = None
    """Bytes."""
    mem_limit: int | None = None
    """Bytes."""


@dataclass(kw_only=True)
class Log:
    """One log line of a training process."""

    rank: int | None = None
    pid: int | None = None
    tid: int | None = None
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

    rank: int | None = None
    pid: int | None = None
    tid: int | None = None
    step: int | None = None
    name: str
    value: float


@dataclass(kw_only=True)
class Step:
    """One training step and where its time went."""

    rank: int | None = None
    pid: int | None = None
    tid: int | None = None
    step: int
    epoch: int | None = None
    phase: str | None = None
    duration_s: float
    data_wait_s: float | None = None
    compute_s: float | None = None
    samples: int | None = None


@dataclass(kw_only=True)
class Profile:
    """A profiler capture of a few steps: its summary and, optionally, the trace itself."""

    rank: int | None = None
    pid: int | None = None
    profile_id: str
    request_id: int | None = None
    """The on-demand request this profile answers, if any."""
    step_start: int | None = None
    step_end: int | None = None
    summary: Json
    diagnosis: Json | None = None
    trace_gz_b64: Text | None = None
    """The gzip-compressed trace in base64; the validator gives it a larger cap of its own."""
    note: str | None = None


@dataclass(kw_only=True)
class JobStarted:
    """A job's metadata, from a Slurm prolog or the training process's run metadata."""

    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    name: str | None = None
    nodes: list[str] | None = None
    node_count: int | None = None
    gpus: list[str] | None = None
    """The job's GPU indices on the sending node; the collector prefixes them with ``node``."""
    time_limit_s: int | None = None
    demo: bool | None = None
    attrs: Json | None = None


@dataclass(kw_only=True)
class JobEnded:
    """The end of a job, from a Slurm epilog or the training process."""

    exit_code: int | None = None
    state: str | None = None


@dataclass(kw_only=True)
class Dropped:
    """Records the agent had to throw away."""

    count: int
    reason: str | None = None


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
}
