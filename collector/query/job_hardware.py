"""One job's hardware over a window, as :mod:`jobsight.rules.hardware_cause` compares it: each
GPU's clocks, temperature, power, throttle reasons and error counters (from its samples, both
tiers), the Xids its GPUs reported, each node's host CPU, and which GPU each rank uses.

Read by the health evaluator only for a job with a straggler or hung finding, so a few queries
over one job's last minutes, aggregated in SQL (a 512-GPU job's 10 minutes are 307 k samples and
512 rows out).

Which GPU a rank uses comes from its ``fit_start`` event (``agent/training/fit_telemetry.py``),
which a job writes, so it is checked and only ever picks among the job's own GPUs: its
``gpu_uuid`` when it names one of them, else its ``device`` (``cuda:N``) or ``local_rank`` as the
N-th of the job's GPUs on its node in index order (Slurm's ``CUDA_VISIBLE_DEVICES`` numbers the
allocated GPUs so). A rank that names none has no GPU: the cause then compares nodes only.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Final

from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import reads as tiers
from jobsight.protocol import throttle
from jobsight.protocol.run_events import FIT_START
from jobsight.rules.hardware_cause import GpuCondition, Held, JobHardware, NodeCondition, Xid

START_EVENT: Final = FIT_START
_DEVICE: Final = re.compile(r"cuda:(\d{1,4})")
_COUNTERS: Final = ("nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors")


def gpu_name(node: str | None, index: int, mig: str | None = "") -> str:
    """``node/index`` (``node/index/mig`` for a MIG device): how findings and pages name a GPU."""
    return f"{node or '?'}/{index}" + (f"/{mig}" if mig else "")


def _held_columns(slowdown: throttle.Slowdown) -> str:
    held = f"FILTER (WHERE throttle_reasons & {slowdown.mask} <> 0)"
    measure = f"avg({slowdown.measure}) {held}" if slowdown.measure else "NULL::float8"
    return f"count(*) {held} AS n_{slowdown.name}, {measure} AS v_{slowdown.name}"


def _rise(column: str) -> str:
    return f"coalesce(max({column}) - min({column}), 0)"


_GPUS: Final = f"""
SELECT node, gpu_index, max(gpu_uuid) AS gpu_uuid, count(*) AS n, avg(sm_clock_mhz) AS clock, avg(temp_c) AS temp,
       avg(power_w) AS power, count(throttle_reasons) AS reasons_n,
       {", ".join(_held_columns(s) for s in throttle.SLOWDOWNS)},
       {" + ".join(_rise(c) for c in _COUNTERS)} AS nvlink, {_rise("pcie_replays")} AS pcie,
       min(ts) FILTER (WHERE lost) AS lost_at
FROM {tiers.samples(("sm_clock_mhz", "temp_c", "power_w", "throttle_reasons", *_COUNTERS, "pcie_replays", "lost"),
                    start="%(start)s", end="%(end)s")} s
WHERE coalesce(mig_uuid, '') = ''
GROUP BY node, gpu_index
"""

_XIDS: Final = """
SELECT node, gpu_index, ts, code FROM gpu_events
WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= %(since)s AND event = 'xid'
ORDER BY ts LIMIT 1000
"""

_NODES: Final = """
SELECT node, avg(cpu_util) AS cpu FROM host_samples
WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= %(start)s AND ts <= %(end)s AND node IS NOT NULL
GROUP BY node
"""

_STARTS: Final = """
SELECT DISTINCT ON (rank) rank, node, attrs FROM log_events
WHERE job_id = %(job)s AND cluster = %(cluster)s AND rank IS NOT NULL AND attrs->>'event' = %(event)s
ORDER BY rank, ts DESC
"""

_STEP_NODES: Final = """
SELECT DISTINCT ON (rank) rank, node FROM steps
WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= %(start)s AND rank IS NOT NULL AND node IS NOT NULL
ORDER BY rank, ts DESC
"""


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _condition(row: Mapping[str, Any]) -> GpuCondition:
    n = int(row["reasons_n"] or 0)
    held = {s.name: Held(int(row[f"n_{s.name}"]) / n, _float(row[f"v_{s.name}"]))
            for s in throttle.SLOWDOWNS if n and row[f"n_{s.name}"]}
    return GpuCondition(
        gpu_name(row["node"], row["gpu_index"]), row["node"], int(row["n"]), _float(row["clock"]),
        _float(row["temp"]), _float(row["power"]), held, int(row["nvlink"] or 0), int(row["pcie"] or 0),
        None if row["lost_at"] is None else row["lost_at"].timestamp(),
    )


def _position(attrs: Any) -> tuple[str | None, int | None]:
    """The GPU a start event's attrs name: (uuid, position among the node's GPUs of the job)."""
    if not isinstance(attrs, Mapping):
        return None, None
    uuid = attrs.get("gpu_uuid")
    uuid = uuid if isinstance(uuid, str) and 0 < len(uuid) <= 96 else None
    device = attrs.get("device")
    if isinstance(device, str) and (match := _DEVICE.fullmatch(device)):
        return uuid, int(match.group(1))
    local = attrs.get("local_rank")
    if isinstance(local, int) and not isinstance(local, bool) and 0 <= local < 4096:
        return uuid, local
    return uuid, None


def _bare(uuid: str) -> str:
    """A GPU UUID without NVML's ``GPU-`` prefix (torch gives it bare)."""
    return uuid.removeprefix("GPU-").lower()


def read_job_hardware(conn: Connection, cluster: str, job: str, start: float, end: float,
                      xids_since: float) -> JobHardware:
    """The job's hardware over ``[start, end]`` (seconds since the epoch); Xids from ``xids_since``."""
    params = {"job": job, "cluster": cluster, "start": dt.datetime.fromtimestamp(start, dt.UTC),
              "end": dt.datetime.fromtimestamp(end, dt.UTC)}
    rows = conn.execute(_GPUS, params).fetchall()
    gpus = {c.gpu: c for c in map(_condition, rows)}
    by_uuid = {_bare(str(r["gpu_uuid"])): gpu_name(r["node"], r["gpu_index"]) for r in rows if r["gpu_uuid"]}
    on_node: dict[str, list[str]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["node"] or "", r["gpu_index"])):
        on_node[r["node"] or ""].append(gpu_name(r["node"], r["gpu_index"]))
    xids = [Xid(gpu_name(r["node"], r["gpu_index"]), r["ts"].timestamp(), int(r["code"]))
            for r in conn.execute(_XIDS, {**params, "since": dt.datetime.fromtimestamp(xids_since, dt.UTC)})]
    nodes = {r["node"]: NodeCondition(r["node"], _float(r["cpu"])) for r in conn.execute(_NODES, params)}
    node_of_rank = {int(r["rank"]): str(r["node"]) for r in conn.execute(_STEP_NODES, params)}
    gpu_of_rank: dict[int, str] = {}
    for r in conn.execute(_STARTS, {**params, "event": START_EVENT}):
        rank, node = int(r["rank"]), r["node"] or node_of_rank.get(int(r["rank"]), "")
        node_of_rank.setdefault(rank, node)
        uuid, position = _position(r["attrs"])
        if uuid is not None and _bare(uuid) in by_uuid:
            gpu_of_rank[rank] = by_uuid[_bare(uuid)]
        elif position is not None and position < len(on_node.get(node, [])):
            gpu_of_rank[rank] = on_node[node][position]
    return JobHardware(start, end, gpus, xids, nodes, gpu_of_rank, node_of_rank)
