"""Why a rank is slow or hung, from its GPU and node beside the others of the job.

The health rules (:mod:`jobsight.rules.health`) say *which* rank holds a job back; this says
*why*, with the numbers, or says honestly that nothing in the hardware differs. The collector's
evaluator reads, for a job with a straggler or hung finding, each GPU's samples over the
finding's window (:class:`GpuCondition`), the Xid errors its GPUs reported (:class:`Xid`), each
node's host CPU (:class:`NodeCondition`) and which GPU each rank uses, and calls
:func:`straggler_cause` or :func:`hang_cause`. Standard library and :mod:`jobsight.protocol` only.

What is compared, in order (the first that holds is the cause):

* an Xid error on the rank's GPU in the window, or the GPU gone from the bus;
* its GPU's SM clock well under the others' (:data:`SLOW_CLOCK`), with what NVML said held it
  (thermal slowdown, power cap, hardware brakes: :mod:`jobsight.protocol.throttle`), the share
  of the window each held and the temperature or power;
* NVLink or PCIe errors counted on its GPU in the window and not on the others';
* its node's host CPU saturated while the other nodes' is not;
* its data wait (time for its batch) a multiple of the other ranks';
* none of these: "nothing in the hardware differs", with what was compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from jobsight.protocol import throttle
from jobsight.protocol.step_phases import clock

SLOW_CLOCK: Final = 0.85
"""A GPU whose mean SM clock is under this share of the others' median runs slow."""
HELD_SHARE: Final = 0.10
"""A throttle reason set in under this share of a GPU's samples is not named."""
CPU_SATURATED: Final = 90.0
"""A node's host CPU (percent of the job's cores) at or above this is saturated..."""
CPU_OTHERS: Final = 0.8
"""...when the other nodes' stay under this share of it."""
DATA_WAIT_RATIO: Final = 2.0
DATA_WAIT_MIN_S: Final = 0.005
"""A rank's data wait this many times the others' median, and at least this long, is its cause."""
XID_BEFORE_S: Final = 300.0
"""An Xid up to this long before a rank's last step can explain its silence (a GPU may limp a
little after an error before the process stops)."""

XIDS: Final[Mapping[int, str]] = {
    13: "graphics engine exception: often the application's own fault",
    31: "GPU memory page fault: often the application's own fault",
    43: "GPU stopped processing: often the application's own fault",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapper failure",
    74: "NVLink error",
    79: "GPU fell off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""What an Xid number means (NVIDIA's Xid catalogue), for a finding's words."""


def xid_text(code: int) -> str:
    """``Xid 79 (GPU fell off the bus)``."""
    meaning = XIDS.get(code)
    return f"Xid {code}" + (f" ({meaning})" if meaning else "")


@dataclass(frozen=True)
class Held:
    share: float
    """Of the GPU's samples that had throttle reasons, those with this one set."""
    value: float | None = None
    """The mean of the slowdown's measure (temperature, power) while it held."""


@dataclass(frozen=True)
class GpuCondition:
    """One GPU of the job over a window, from its samples."""

    gpu: str
    """``node/index``."""
    node: str | None
    samples: int
    sm_clock_mhz: float | None = None
    """Mean SM clock over the samples that had one."""
    temp_c: float | None = None
    """Mean temperature."""
    power_w: float | None = None
    held: Mapping[str, Held] = field(default_factory=dict)
    """Per slowdown (:data:`jobsight.protocol.throttle.SLOWDOWNS` by name) that held it at all,
    its share of the samples and the temperature or power while it held."""
    nvlink_errors: int = 0
    """CRC, replay and recovery errors its links counted in the window (the counters' rise)."""
    pcie_replays: int = 0
    lost_at: float | None = None
    """When its samples first said it fell off the bus."""


@dataclass(frozen=True)
class Xid:
    gpu: str
    at: float
    code: int


@dataclass(frozen=True)
class NodeCondition:
    node: str
    cpu_util: float | None
    """Mean host CPU of the job on the node over the window, percent of its cores."""


@dataclass(frozen=True)
class JobHardware:
    """What the evaluator read for one job: its GPUs and nodes over the window, its Xids, and
    where each rank runs."""

    start: float
    end: float
    gpus: Mapping[str, GpuCondition] = field(default_factory=dict)
    xids: Sequence[Xid] = ()
    nodes: Mapping[str, NodeCondition] = field(default_factory=dict)
    gpu_of_rank: Mapping[int, str] = field(default_factory=dict)
    """The GPU each rank uses, where known (its start event named it)."""
    node_of_rank: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Cause:
    kind: str
    """``xid``, ``gpu_lost``, ``clocks``, ``links``, ``host_cpu``, ``data_wait`` or ``none``."""
    text: str
    """A sentence (or two) for the finding's message."""
    evidence: dict[str, Any]
    rank: int | None = None
    gpu: str | None = None
    node: str | None = None
    at: float | None = None


def _mhz(value: float) -> str:
    return f"{value:,.0f} MHz"


def _held(gpu: GpuCondition) -> list[tuple[throttle.Slowdown, Held]]:
    """The slowdowns that held ``gpu`` for :data:`HELD_SHARE` of the window or more, longest first."""
    held = [(s, gpu.held[s.name]) for s in throttle.SLOWDOWNS
            if s.name in gpu.held and gpu.held[s.name].share >= HELD_SHARE]
    return sorted(held, key=lambda item: -item[1].share)


def _detail(slowdown: throttle.Slowdown, held: Held) -> str:
    if held.value is None:
        return ""
    return f" at {held.value:.0f} °C" if slowdown.measure == "temp_c" else f" at {held.value:.0f} W"


def _reasons_text(gpu: GpuCondition) -> str:
    held = _held(gpu)
    if not held:
        return "no throttle reason set (NVML names none)" + (f", at {gpu.temp_c:.0f} °C" if gpu.temp_c else "")
    return ", ".join(f"{slowdown.label} for {100 * h.share:.0f} % of the window{_detail(slowdown, h)}"
                     for slowdown, h in held)


def _gpu_evidence(gpu: GpuCondition) -> dict[str, Any]:
    return {"gpu": gpu.gpu, "samples": gpu.samples,
            "sm_clock_mhz": None if gpu.sm_clock_mhz is None else round(gpu.sm_clock_mhz, 1),
            "temp_c": None if gpu.temp_c is None else round(gpu.temp_c, 1),
            "power_w": None if gpu.power_w is None else round(gpu.power_w, 1),
            "held": {k: {"share": round(h.share, 3), "value": None if h.value is None else round(h.value, 1)}
                     for k, h in sorted(gpu.held.items())},
            "nvlink_errors": gpu.nvlink_errors, "pcie_replays": gpu.pcie_replays}


def _xid_cause(rank: int, gpu: GpuCondition | None, hw: JobHardware, since: float, *,
               hung_at: float | None) -> Cause | None:
    if gpu is None:
        return None
    xids = sorted((x for x in hw.xids if x.gpu == gpu.gpu and x.at >= since), key=lambda x: x.at)
    if xids:
        # The most telling one: a fatal Xid over an application's own, else the first.
        xid = next((x for x in xids if x.code in (79, 48, 95, 74, 64, 119, 120)), xids[0])
        more = f" ({len(xids) - 1} more Xid{'s' if len(xids) > 2 else ''} on it)" if len(xids) > 1 else ""
        if hung_at is None:
            text = f"Rank {rank}'s GPU ({gpu.gpu}) reported {xid_text(xid.code)} at {clock(xid.at)}{more}."
        elif hung_at >= xid.at:
            text = (f"Rank {rank} hung {hung_at - xid.at:.0f} s after {xid_text(xid.code)} on {gpu.gpu} "
                    f"at {clock(xid.at)}{more}.")
        else:
            text = (f"Rank {rank}'s GPU {gpu.gpu} reported {xid_text(xid.code)} at {clock(xid.at)}, "
                    f"{xid.at - hung_at:.0f} s after the rank's last step{more}.")
        return Cause("xid", text, {"xid": xid.code, "xid_at": round(xid.at, 3), "xids": [x.code for x in xids],
                                   **_gpu_evidence(gpu)}, rank=rank, gpu=gpu.gpu, node=gpu.node, at=xid.at)
    if gpu.lost_at is not None and gpu.lost_at >= since:
        return Cause("gpu_lost", f"Rank {rank}'s GPU {gpu.gpu} fell off the bus at {clock(gpu.lost_at)} "
                     "(NVML lost it; no Xid was read).", {"lost_at": round(gpu.lost_at, 3), **_gpu_evidence(gpu)},
                     rank=rank, gpu=gpu.gpu, node=gpu.node, at=gpu.lost_at)
    return None


def _others(hw: JobHardware, gpu: GpuCondition | None) -> list[GpuCondition]:
    return [g for name, g in hw.gpus.items() if gpu is None or name != gpu.gpu]


def _clock_cause(rank: int, gpu: GpuCondition, others: Sequence[GpuCondition]) -> Cause | None:
    clocks = [g.sm_clock_mhz for g in others if g.sm_clock_mhz is not None]
    if gpu.sm_clock_mhz is None or not clocks:
        return None
    typical = statistics.median(clocks)
    if typical <= 0 or gpu.sm_clock_mhz >= SLOW_CLOCK * typical:
        return None
    text = (f"Rank {rank}'s GPU ({gpu.gpu}) ran at {_mhz(gpu.sm_clock_mhz)} against {_mhz(typical)} on the "
            f"others: {_reasons_text(gpu)}.")
    return Cause("clocks", text, {**_gpu_evidence(gpu), "others_sm_clock_mhz": round(typical, 1),
                                  "slowed_by": [s.name for s, _ in _held(gpu)]}, rank=rank, gpu=gpu.gpu, node=gpu.node)


def _link_cause(rank: int, gpu: GpuCondition, others: Sequence[GpuCondition]) -> Cause | None:
    parts = []
    if gpu.nvlink_errors > 0 and all(g.nvlink_errors == 0 for g in others):
        parts.append(f"{gpu.nvlink_errors:,} NVLink errors (CRC, replay, recovery)")
    if gpu.pcie_replays > 0 and all(g.pcie_replays == 0 for g in others):
        parts.append(f"{gpu.pcie_replays:,} PCIe replays")
    if not parts:
        return None
    return Cause("links", f"Rank {rank}'s GPU ({gpu.gpu}) counted {' and '.join(parts)} in the window, the others "
                 "none: traffic over that link is sent again, and every collective waits for it.",
                 _gpu_evidence(gpu), rank=rank, gpu=gpu.gpu, node=gpu.node)


def _cpu_cause(rank: int, node: str | None, hw: JobHardware) -> Cause | None:
    mine = hw.nodes.get(node or "")
    others = [n.cpu_util for name, n in hw.nodes.items() if name != node and n.cpu_util is not None]
    if mine is None or mine.cpu_util is None or not others or mine.cpu_util < CPU_SATURATED:
        return None
    typical = statistics.median(others)
    if typical >= CPU_OTHERS * mine.cpu_util:
        return None
    return Cause("host_cpu", f"Rank {rank}'s node {node} had its host CPU saturated ({mine.cpu_util:.0f} % of the "
                 f"job's cores against {typical:.0f} % on the other nodes): the input pipeline or another process "
                 "starves it.", {"node": node, "cpu_util": round(mine.cpu_util, 1),
                                 "others_cpu_util": round(typical, 1)}, rank=rank, node=node)


def _data_cause(rank: int, data_wait: Mapping[int, float]) -> Cause | None:
    mine = data_wait.get(rank)
    others = [v for r, v in data_wait.items() if r != rank]
    if mine is None or not others or mine < DATA_WAIT_MIN_S:
        return None
    typical = statistics.median(others)
    if mine < DATA_WAIT_RATIO * max(typical, 1e-9):
        return None
    ratio = f"{mine / typical:.1f}×" if typical > 0 else "far above"
    return Cause("data_wait", f"Rank {rank} waits {ratio} the other ranks for its batches ({mine * 1000:.1f} ms "
                 f"against {typical * 1000:.1f} ms per step): its input pipeline or data shard, not its GPU.",
                 {"data_wait_s": round(mine, 6), "others_data_wait_s": round(typical, 6)}, rank=rank)


def _against(clock_mhz: float, others: Sequence[GpuCondition]) -> tuple[str, bool]:
    """How the rank's SM clock compares with the others' median, in words, and whether the two are
    alike; ``("", True)`` with nothing to compare. A clock under :data:`SLOW_CLOCK` of the others' is
    the clock cause, found before this; one that much above theirs (the others idle, or held by
    something of their own) is said to be faster, never "like" them."""
    clocks = [g.sm_clock_mhz for g in others if g.sm_clock_mhz is not None]
    if not clocks:
        return "", True
    typical = statistics.median(clocks)
    if typical < SLOW_CLOCK * clock_mhz:
        return f", faster than the others ({_mhz(typical)})", False
    return f" like the others ({_mhz(typical)})", True


def _nothing(rank: int, gpu: GpuCondition | None, others: Sequence[GpuCondition]) -> Cause:
    alike = True
    if gpu is None:
        compared = ("which GPU it uses is not known (its start event named none), and no GPU, node or "
                    "link of the job shows a throttle, an Xid or link errors")
    else:
        ran = "showed no clock"
        if gpu.sm_clock_mhz is not None:
            against, alike = _against(gpu.sm_clock_mhz, others)
            ran = f"ran at {_mhz(gpu.sm_clock_mhz)}{against}"
        compared = f"its GPU ({gpu.gpu}) {ran}, with no throttle reason held, no Xid and no link errors"
    evidence: dict[str, Any] = {"compared": "clocks, throttle reasons, Xids, NVLink/PCIe errors, host CPU, data wait"}
    if gpu is not None:
        evidence.update(_gpu_evidence(gpu))
    lead = "Nothing in the hardware differs" if alike else "Nothing in its hardware slows it"
    return Cause("none", f"{lead}: {compared}. Look at its data shard or its code "
                 "(the profile window shows where its step goes).", evidence, rank=rank,
                 gpu=None if gpu is None else gpu.gpu, node=None if gpu is None else gpu.node)


def _gpu(rank: int, hw: JobHardware) -> GpuCondition | None:
    name = hw.gpu_of_rank.get(rank)
    return None if name is None else hw.gpus.get(name)


def _job_faults(hw: JobHardware) -> bool:
    """Any GPU of the job throttled, erroring or lost (so an unknown GPU cannot be said clean)."""
    return bool(hw.xids) or any(
        _held(g) or g.nvlink_errors or g.pcie_replays or g.lost_at is not None for g in hw.gpus.values())


def straggler_cause(rank: int, hw: JobHardware, data_wait: Mapping[int, float]) -> Cause | None:
    """Why ``rank`` is slower than the other ranks over ``hw``'s window; ``None`` when neither its
    GPU is known nor the job's hardware clean enough to say nothing differs."""
    gpu = _gpu(rank, hw)
    node = hw.node_of_rank.get(rank) or (gpu.node if gpu else None)
    others = _others(hw, gpu)
    if gpu is not None:
        for cause in (_xid_cause(rank, gpu, hw, hw.start, hung_at=None), _clock_cause(rank, gpu, others),
                      _link_cause(rank, gpu, others)):
            if cause is not None:
                return cause
    for cause in (_cpu_cause(rank, node, hw), _data_cause(rank, data_wait)):
        if cause is not None:
            return cause
    if gpu is None and _job_faults(hw):
        return None
    return _nothing(rank, gpu, others)


def hang_cause(ranks: Sequence[int], last_step: Mapping[int, float], hw: JobHardware) -> Cause | None:
    """A GPU fault behind the silence of one of ``ranks`` (the rank(s) the finding names, or every
    rank when it cannot tell): an Xid on its GPU, or the GPU lost, from :data:`XID_BEFORE_S`
    before its last step on. ``None`` when there is none."""
    found = []
    for rank in ranks:
        gpu = _gpu(rank, hw)
        since = last_step.get(rank, hw.start) - XID_BEFORE_S
        cause = _xid_cause(rank, gpu, hw, since, hung_at=last_step.get(rank))
        if cause is not None:
            found.append(cause)
    return min(found, key=lambda c: c.at or 0.0) if found else None
