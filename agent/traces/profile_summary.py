"""What a profile says: where one rank's time went (compute, communication, memcpy, data
loading, and idle on a GPU or other host time on CPU) from the Chrome trace events, the top
ops from the torch profiler with the user's lines behind the most called ones, and the CUDA
memory facts. Feeds the ``summary`` of a ``profile``
record (:mod:`jobsight.agent.training.profiling`)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from jobsight.agent.traces.profile_sources import Source, SourceFinder

TOP_OPS: Final = 15
MOST_CALLED: Final = 5

COMM_PATTERN: Final = re.compile(
    r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all|send|recv", re.I
)
DATA_PATTERN: Final = re.compile(r"DataLoader|jobsight\.data_wait", re.I)
MEMCPY_PATTERN: Final = re.compile(r"memcpy|memset", re.I)


# -- the time breakdown, from trace events -------------------------------------------------

LEFTOVER: Final = {"device": "idle_us", "host": "host_other_us"}
"""The key of the window's time in no category, by basis: a GPU with no kernel is idle; a CPU
outside the profiled ops is still running the process (see :func:`breakdown`)."""


Interval = tuple[float, float]


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in _union(intervals))


def _clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def breakdown(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Where one rank's time went over the profiled steps, from Chrome trace events.

    Categories are exclusive, taken in this order: communication (nccl/gloo/c10d
    collectives), memcpy, data loading, compute; what is left of the window is ``idle`` on
    a GPU and ``host_other`` on CPU. On a GPU the basis is the device's timeline (kernels),
    where time without a kernel is the device idling. On CPU only the basis is the host's
    ops, and time outside them is not idle: the process was running Python, framework code
    between ops, or sleeping or waiting in code the profiler has no op for, so it is reported
    as other host time and never called idle.
    ``comm_overlap`` is the share of communication time that overlaps compute (``None``
    without communication). Times are µs.
    """
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in steps if "ts" in e]
    # Python frames (with_stack) are not ops: they would count as compute and, named after
    # torch.distributed functions, as communication.
    timed = [e for e in events if e.get("ph") == "X" and "ts" in e and e.get("cat") not in ("Trace", "python_function")]
    if not spans:
        spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in timed]
    if not spans:
        return {"basis": "none", "window_us": 0.0}
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    kernels = [e for e in timed if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    basis = "device" if kernels else "host"
    pool = kernels if kernels else [e for e in timed if e.get("cat") in ("cpu_op", "user_annotation")]
    comm: list[Interval] = []
    memcpy: list[Interval] = []
    data: list[Interval] = []
    compute: list[Interval] = []
    for event in pool:
        name = str(event.get("name", ""))
        if name.startswith("ProfilerStep#"):
            continue
        span = (float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0)))
        if COMM_PATTERN.search(name):
            comm.append(span)
        elif event.get("cat") in ("gpu_memcpy", "gpu_memset") or MEMCPY_PATTERN.search(name):
            memcpy.append(span)
        elif DATA_PATTERN.search(name):
            data.append(span)
        elif event.get("cat") != "user_annotation":
            compute.append(span)
    if basis == "host" and not comm:
        # A gloo collective runs on its own thread; its CPU-side record still counts.
        comm = [
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            for e in timed
            if COMM_PATTERN.search(str(e.get("name", "")))
        ]
    if basis == "device":
        # Data loading happens on the host; count it where the device had nothing to do.
        data = [
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            for e in timed
            if DATA_PATTERN.search(str(e.get("name", "")))
        ]
    comm, memcpy, data, compute = (_clip(x, lo, hi) for x in (comm, memcpy, data, compute))
    window = hi - lo
    comm_us = _length(comm)
    memcpy_us = _length(comm + memcpy) - comm_us
    data_us = _length(comm + memcpy + data) - comm_us - memcpy_us
    busy = _length(comm + memcpy + data + compute)
    compute_us = busy - comm_us - memcpy_us - data_us
    compute_all = _length(compute)
    overlap = None
    if comm_us > 0:
        overlap = max(0.0, comm_us + compute_all - _length(comm + compute)) / comm_us
    result: dict[str, Any] = {
        "basis": basis,
        "window_us": round(window, 1),
        "compute_us": round(compute_us, 1),
        "communication_us": round(comm_us, 1),
        "memcpy_us": round(memcpy_us, 1),
        "data_loading_us": round(data_us, 1),
        LEFTOVER[basis]: round(max(window - busy, 0.0), 1),
        "comm_overlap": round(overlap, 3) if overlap is not None else None,
        "step_count": len(steps),
        "step_time_us": [round(e - s, 1) for s, e in spans] if steps else [],
    }
    if window > 0:
        for key in ("compute", "communication", "memcpy", "data_loading", LEFTOVER[basis].removesuffix("_us")):
            result[f"{key}_share"] = round(result[f"{key}_us"] / window, 4)
    if kernels:
        durations = [float(e.get("dur", 0)) for e in kernels if e.get("cat") == "kernel"]
        result["kernel_count"] = len(durations)
        result["kernel_mean_us"] = round(sum(durations) / len(durations), 2) if durations else 0.0
    return result


# -- the op summary, from the profiler --------------------------------------------------------


def _op_row(avg: Any, steps: int) -> dict[str, Any]:
    calls = int(avg.count)
    flops = int(getattr(avg, "flops", 0) or 0)
    return {
        "name": str(avg.key)[:200],
        "calls": calls,
        "calls_per_step": round(calls / max(steps, 1), 1),
        "self_cpu_us": round(float(avg.self_cpu_time_total), 1),
        "cpu_total_us": round(float(avg.cpu_time_total), 1),
        "self_device_us": round(float(getattr(avg, "self_device_time_total", 0.0) or 0.0), 1),
        "cpu_memory_bytes": int(getattr(avg, "self_cpu_memory_usage", 0) or 0),
        "device_memory_bytes": int(getattr(avg, "self_device_memory_usage", 0) or 0),
        "flops": flops or None,
    }


@dataclass
class OpSources:
    """Which user lines issued a window's ops: per op name, its calls by line (``None``: no line
    of the user's, a framework's call, or no stack recorded), and per line the calls made there
    (one call of ``cross_entropy`` issues several ops)."""

    by_op: dict[str, Counter[Source | None]] = field(default_factory=lambda: defaultdict(Counter))
    calls: dict[Source, set[int]] = field(default_factory=lambda: defaultdict(set))

    def top(self, op: str, steps: int) -> dict[str, Any] | None:
        """The user line that issued the most of ``op``'s calls (even when a framework issued more),
        with its calls per step of the function called there; ``None`` when no user line did."""
        found = [(count, source) for source, count in self.by_op.get(op, {}).items() if source is not None]
        if not found:
            return None
        _, source = max(found, key=lambda pair: (pair[0], -pair[1].line))
        return source.as_dict(round(len(self.calls[source]) / max(steps, 1), 1))


def op_sources(events: Iterable[Any], finder: SourceFinder | None = None) -> OpSources:
    """The user lines behind each op of ``events`` (the profiler's ``FunctionEvent`` list)."""
    finder = finder or SourceFinder()
    sources = OpSources()
    for event in events:
        if event.is_python_function:
            continue
        found = finder.source(event)
        sources.by_op[str(event.key)][found[0] if found else None] += 1
        if found is not None:
            sources.calls[found[0]].add(found[1])
    return sources


def summarize(prof: Any, steps: int, top: int = TOP_OPS) -> dict[str, Any]:
    """Top ops by self CPU and by self device time, with calls, memory, FLOPs and input shapes;
    the most called ops with the user's line that issued them (``source``, when stacks were
    recorded). Python frames (``with_stack``) are not ops and are left out of the rows."""
    events = prof.events()
    frames = {str(e.key) for e in events if e.is_python_function}
    averages = [
        a for a in prof.key_averages() if not str(a.key).startswith("ProfilerStep#") and str(a.key) not in frames
    ]
    rows = {str(a.key): _op_row(a, steps) for a in averages}
    shapes: dict[str, list[str]] = {}
    try:
        by_shape = sorted(prof.key_averages(group_by_input_shape=True), key=lambda a: -a.self_cpu_time_total)
        for avg in by_shape:
            listed = shapes.setdefault(str(avg.key), [])
            if len(listed) < 3 and avg.input_shapes:
                listed.append(str(avg.input_shapes)[:300])
    except Exception:  # noqa: BLE001 - boundary: shapes are a nicety; some builds do not record them
        shapes = {}
    for name, row in rows.items():
        row["input_shapes"] = shapes.get(name) or None
    sources = op_sources(events) if frames else OpSources()
    by_cpu = sorted(rows.values(), key=lambda r: -r["self_cpu_us"])[:top]
    by_device = [r for r in sorted(rows.values(), key=lambda r: -r["self_device_us"]) if r["self_device_us"] > 0][:top]
    called = [
        {**{k: r[k] for k in ("name", "calls", "calls_per_step", "self_cpu_us")},
         "source": sources.top(r["name"], steps)}
        for r in sorted(rows.values(), key=lambda r: -r["calls_per_step"])
    ]
    # The most called ops, and the most called from a line of the user's code (framework
    # internals can outnumber them): at most 2 × MOST_CALLED rows, so the summary stays small.
    repeated = called[:MOST_CALLED]
    sourced = sorted((c for c in called if c["source"]), key=lambda c: -c["source"]["calls_per_step"])
    named = {c["name"] for c in repeated}
    repeated += [c for c in sourced[:MOST_CALLED] if c["name"] not in named]
    total_cpu = sum(r["self_cpu_us"] for r in rows.values())
    total_device = sum(r["self_device_us"] for r in rows.values())
    return {
        "steps": steps,
        "ops_by_self_cpu": by_cpu,
        "ops_by_self_device": by_device,
        "most_called": repeated,
        "stacks": bool(frames),
        "self_cpu_total_us": round(total_cpu, 1),
        "self_device_total_us": round(total_device, 1),
    }


def _self_times(ops: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, float]]:
    """``(name, duration, self time)`` of each op: its duration less that of the ops nested
    directly in it on its own thread (the torch profiler's "self" time)."""
    by_thread: dict[tuple[Any, Any], list[Mapping[str, Any]]] = defaultdict(list)
    for op in ops:
        by_thread[(op.get("pid"), op.get("tid"))].append(op)
    rows: list[tuple[str, float, float]] = []
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0))))
        stack: list[list[Any]] = []  # [name, start, end, duration, self]
        for op in thread_ops:
            start, duration = float(op.get("ts", 0)), float(op.get("dur", 0))
            while stack and stack[-1][2] <= start:
                rows.append((stack[-1][0], stack[-1][3], stack[-1][4]))
                stack.pop()
            if stack:
                stack[-1][4] -= duration
            stack.append([str(op.get("name", "?"))[:200], start, start + duration, duration, duration])
        rows += [(name, duration, own) for name, _, _, duration, own in stack]
    return rows


def summarize_trace(events: Sequence[Mapping[str, Any]], steps: int, top: int = TOP_OPS) -> dict[str, Any]:
    """:func:`summarize` from a Chrome trace alone: for a process that Kineto profiled on its own
    (no profiler object in hand). Ops are the trace's ``cpu_op`` and ``user_annotation`` events,
device time its kernels';
    no input shapes, memory or source lines (the trace does not carry them)."""
    # User annotations (``Optimizer.step#SGD.step``) are rows of the profiler's table too; its
    # step markers are not.
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
           and not str(e.get("name", "")).startswith("ProfilerStep#")]
    rows: dict[str, dict[str, Any]] = {}
    for name, duration, own in _self_times(ops):
        row = rows.setdefault(name, {"name": name, "calls": 0, "self_cpu_us": 0.0, "cpu_total_us": 0.0,
                                     "self_device_us": 0.0})
        row["calls"] += 1
        row["self_cpu_us"] += max(own, 0.0)
        row["cpu_total_us"] += duration
    kernels: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.get("ph") == "X" and event.get("cat") == "kernel":
            name = str(event.get("name", "?"))[:200]
            row = kernels.setdefault(name, {"name": name, "calls": 0, "self_cpu_us": 0.0, "cpu_total_us": 0.0,
                                            "self_device_us": 0.0})
            row["calls"] += 1
            row["self_device_us"] += float(event.get("dur", 0))
    for row in [*rows.values(), *kernels.values()]:
        row["calls_per_step"] = round(row["calls"] / max(steps, 1), 1)
        for key in ("self_cpu_us", "cpu_total_us", "self_device_us"):
            row[key] = round(row[key], 1)
    by_cpu = sorted(rows.values(), key=lambda r: -r["self_cpu_us"])[:top]
    by_device = sorted(kernels.values(), key=lambda r: -r["self_device_us"])[:top]
    called = [{**{k: r[k] for k in ("name", "calls", "calls_per_step", "self_cpu_us")}, "source": None}
              for r in sorted(rows.values(), key=lambda r: -r["calls_per_step"])[:MOST_CALLED]]
    return {
        "steps": steps,
        "ops_by_self_cpu": by_cpu,
        "ops_by_self_device": by_device,
        "most_called": called,
        "stacks": False,
        "self_cpu_total_us": round(sum(r["self_cpu_us"] for r in rows.values()), 1),
        "self_device_total_us": round(sum(r["self_device_us"] for r in kernels.values()), 1),
    }


def memory_facts() -> dict[str, Any] | None:
    """Peak and total CUDA memory, allocator retries and OOMs; ``None`` without CUDA or when torch cannot tell."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        stats = torch.cuda.memory_stats()
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        return {
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "total_bytes": int(total),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "ooms": int(stats.get("num_ooms", 0)),
        }
    except Exception:  # noqa: BLE001 - boundary: memory facts are optional evidence
        return None
