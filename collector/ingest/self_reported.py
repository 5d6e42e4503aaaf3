"""Hardware samples a job sends about itself, kept apart from the node's.

A job token is in the user's hands: a job that idles its GPUs could send ``gpu_sample`` records at
95 % and hide from the idle and low-utilisation findings, the summaries and the audit; one that runs
slow could send ``gpu_event`` records of Xid errors and blame the hardware (a node drained for
nothing). So for a job a prolog registered (a Slurm job, whose node daemon samples its GPUs as
root), ``gpu_sample``, ``gpu_event`` and ``host_sample`` records count only from the node tokens of
its allocation (and admins). What the job sends itself is still kept and shown: each value becomes
a training metric named ``self-reported/<node>/gpu<index>/<field>`` (an event:
``.../gpu<index>/<event>``, its code the value; ``.../host/<field>`` for the host), on the job
page's metrics chart, and never reaches the tables the findings, summaries and audit read.

A run outside Slurm (no prolog, its own in-process sampler: the only sampler it has) keeps its
samples as they are. See ``docs/security.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from jobsight.collector.ingest.rows import PreparedBatch, prepare
from jobsight.protocol.records import GpuSample, HostSample
from jobsight.protocol.wire import Batch

PREFIX: Final = "self-reported"
SAMPLE_KINDS: Final = frozenset({"gpu_sample", "gpu_event", "host_sample"})
"""The kinds that speak for the hardware, which the node daemon sends for a registered job."""
# The measurements a sample carries (numbers and flags), not its names and ids.
_GPU_VALUES: Final = tuple(f.name for f in dataclasses.fields(GpuSample)
                           if f.name not in ("gpu_index", "gpu_uuid", "gpu_name", "mig_uuid"))
_HOST_VALUES: Final = tuple(f.name for f in dataclasses.fields(HostSample)
                            if f.name not in ("power_source", "energy_split"))


def has_samples(batch: Batch) -> bool:
    return any(record["kind"] in SAMPLE_KINDS for record in batch.records)


def _metrics_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``metric`` record per value the sample holds."""
    node = record.get("node") or "unknown-node"
    if record["kind"] == "gpu_event":
        return [{"kind": "metric", "job": record["job"], "ts": record["ts"], "node": record.get("node"),
                 "name": f"{PREFIX}/{node}/gpu{record['gpu_index']}/{record['event']}",
                 "value": float(record["code"])}]
    if record["kind"] == "gpu_sample":
        where, fields = f"{node}/gpu{record['gpu_index']}", _GPU_VALUES
    else:
        where, fields = f"{node}/host", _HOST_VALUES
    out = []
    for name in fields:
        value = record.get(name)
        if value is None:
            continue
        out.append({"kind": "metric", "job": record["job"], "ts": record["ts"], "node": record.get("node"),
                    "name": f"{PREFIX}/{where}/{name}", "value": float(value)})
    return out


def as_self_reported(batch: Batch) -> tuple[Batch, PreparedBatch]:
    """``batch`` with its hardware samples turned into self-reported metrics, prepared again."""
    records: list[dict[str, Any]] = []
    for record in batch.records:
        records.extend(_metrics_of(record) if record["kind"] in SAMPLE_KINDS else [record])
    rewritten = Batch(batch.source, batch.seq, batch.sent_at, batch.cluster, records)
    return rewritten, prepare(rewritten)
