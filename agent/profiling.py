"""Profiling windows over training steps, framework-neutral.

A :class:`ProfileWindow` runs the torch profiler over a step schedule
(skip_first, wait, warmup, active, repeat); each active cycle becomes one
``profile`` record: a compact summary (top ops, a time breakdown, step times), the
diagnosis of :mod:`agent.diagnosis`, and the Chrome/Kineto trace gzipped under a
size cap. :class:`StepProfiling` is what callbacks drive: the configured window on
chosen ranks plus on-demand requests from :mod:`agent.directives`. When neither is
active its ``after_step`` reads one attribute and returns.

torch is imported only when a window starts: ``agent`` imports without it.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from agent import diagnosis, wire

if TYPE_CHECKING:
    from agent.directives import DirectivePoller, ProfileRequest
    from agent.run_records import RunRecorder

log = logging.getLogger("jobsight.agent.profiling")

DEFAULT_TRACE_CAP_BYTES: Final = 4 * 1024 * 1024
"""Gzipped trace bytes kept at most; over it the profile carries its summary only."""
TOP_OPS: Final = 15

COMM_PATTERN: Final = re.compile(
    r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all|send|recv", re.I
)
DATA_PATTERN: Final = re.compile(r"DataLoader|jobsight\.data_wait", re.I)
MEMCPY_PATTERN: Final = re.compile(r"memcpy|memset", re.I)


@dataclass(frozen=True)
class ProfileSchedule:
    """The torch profiler schedule, counted in training steps (see ``torch.profiler.schedule``).

    ``repeat=0`` repeats until training ends.
    """

    skip_first: int = 0
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1

    def __post_init__(self) -> None:
        for name in ("skip_first", "wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ValueError(f"profile schedule: {name} must be >= 0")
        if self.active < 1:
            raise ValueError("profile schedule: active must be >= 1")

    @property
    def total_steps(self) -> int | None:
        """Steps until the schedule is done; ``None`` for ``repeat=0`` (never)."""
        if self.repeat == 0:
            return None
        return self.skip_first + (self.wait + self.warmup + self.active) * self.repeat


@dataclass(frozen=True)
class ProfileOptions:
    record_shapes: bool = True
    profile_memory: bool = True
    with_flops: bool = True
    with_stack: bool = False
    trace_cap_bytes: int = DEFAULT_TRACE_CAP_BYTES

    def __post_init__(self) -> None:
        if self.trace_cap_bytes < 0:
            raise ValueError("trace_cap_bytes must be >= 0 (0 keeps no trace)")


def as_schedule(profile: bool | ProfileSchedule | Mapping[str, int] | None) -> ProfileSchedule | None:
    """A callback's ``profile=`` argument as a schedule: ``True`` is the default one, falsy is off.

    Raises ``ValueError``/``TypeError`` for a bad value (callbacks call this in ``__init__``).
    """
    if profile is None or profile is False:
        return None
    if profile is True:
        return ProfileSchedule()
    if isinstance(profile, ProfileSchedule):
        return profile
    if isinstance(profile, Mapping):
        return ProfileSchedule(**profile)
    raise TypeError(f"profile must be a bool, a ProfileSchedule or a dict, not {type(profile).__name__}")


def check_ranks(ranks: Iterable[int] | None) -> tuple[int, ...] | None:
    """``None`` means every rank."""
    if ranks is None:
        return None
    checked = tuple(ranks)
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in checked):
        raise ValueError(f"ranks must be non-negative integers, got {checked!r}")
    return checked


def rank_chosen(rank: int | None, ranks: Sequence[int] | None) -> bool:
    return ranks is None or (rank or 0) in ranks


# -- the time breakdown, from trace events -------------------------------------------------


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
    collectives), memcpy, data loading, compute; idle is what is left of the window.
    On a GPU the basis is the device's timeline (kernels); on CPU only it is the host's.
    ``comm_overlap`` is the share of communication time that overlaps compute (``None``
    without communication). Times are µs.
    """
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in steps if "ts" in e]
    timed = [e for e in events if e.get("ph") == "X" and "ts" in e and e.get("cat") != "Trace"]
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
        "idle_us": round(max(window - busy, 0.0), 1),
        "comm_overlap": round(overlap, 3) if overlap is not None else None,
        "step_count": len(steps),
        "step_time_us": [round(e - s, 1) for s, e in spans] if steps else [],
    }
    if window > 0:
        for key in ("compute", "communication", "memcpy", "data_loading", "idle"):
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


def summarize(prof: Any, steps: int, top: int = TOP_OPS) -> dict[str, Any]:
    """Top ops by self CPU and by self device time, with calls, memory, FLOPs and input shapes."""
    averages = [a for a in prof.key_averages() if not str(a.key).startswith("ProfilerStep#")]
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
    by_cpu = sorted(rows.values(), key=lambda r: -r["self_cpu_us"])[:top]
    by_device = [r for r in sorted(rows.values(), key=lambda r: -r["self_device_us"]) if r["self_device_us"] > 0][:top]
    repeated = sorted(rows.values(), key=lambda r: -r["calls_per_step"])[:5]
    total_cpu = sum(r["self_cpu_us"] for r in rows.values())
    total_device = sum(r["self_device_us"] for r in rows.values())
    return {
        "steps": steps,
        "ops_by_self_cpu": by_cpu,
        "ops_by_self_device": by_device,
        "most_called": [{k: r[k] for k in ("name", "calls", "calls_per_step", "self_cpu_us")} for r in repeated],
        "self_cpu_total_us": round(total_cpu, 1),
        "self_device_total_us": round(total_device, 1),
    }


def pack_trace(raw: bytes, cap_bytes: int) -> tuple[str | None, str | None]:
    """The trace as base64 of gzip, or ``None`` and a note when it is over the cap."""
    cap = min(cap_bytes, wire.MAX_TRACE_B64 * 3 // 4)
    packed = gzip.compress(raw, compresslevel=6)
    if len(packed) > cap:
        note = (
            f"trace left out: {len(packed) / 1e6:.1f} MB gzipped is over the cap of {cap / 1e6:.1f} MB "
            "(profile fewer steps, or raise trace_cap_bytes); summary only"
        )
        return None, note
    return base64.b64encode(packed).decode("ascii"), None


def _memory_facts() -> dict[str, Any] | None:
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


# -- one window --------------------------------------------------------------------------------


@dataclass
class WindowResult:
    uploads: int = 0
    errors: list[str] = field(default_factory=list)


class ProfileWindow:
    """The torch profiler over one schedule; each active cycle is uploaded through ``recorder``.

    ``schedule=None`` records everything from :meth:`start` to :meth:`stop` (one upload).

    ``first_step`` is the training step at which :meth:`start` is called, so records
    name real step numbers. ``extra`` is merged into every summary (framework, precision).
    """

    def __init__(
        self,
        recorder: RunRecorder,
        schedule: ProfileSchedule | None,
        options: ProfileOptions | None = None,
        *,
        request_id: int | None = None,
        first_step: int = 0,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.recorder = recorder
        self.schedule = schedule
        self.options = options or ProfileOptions()
        self.request_id = request_id
        self.first_step = first_step
        self.extra = dict(extra or {})
        self.result = WindowResult()
        self.profiler: Any = None
        self._steps = 0
        self._stopped = False

    def build(self) -> Any:
        """Make the torch profiler (not started): for a caller that enters it with ``with``."""
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        s = self.schedule
        self.profiler = profile(
            activities=activities,
            schedule=(
                schedule(skip_first=s.skip_first, wait=s.wait, warmup=s.warmup, active=s.active, repeat=s.repeat)
                if s is not None
                else None
            ),
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.options.record_shapes,
            profile_memory=self.options.profile_memory,
            with_flops=self.options.with_flops,
            with_stack=self.options.with_stack,
        )
        return self.profiler

    def start(self) -> None:
        """Start the torch profiler; raises ``RuntimeError`` when another one is running (starting
        ours would end theirs)."""
        import torch

        if torch._C._autograd._profiler_enabled():
            raise RuntimeError("another torch profiler is already running")
        self.build().start()

    def step(self) -> bool:
        """Advance one training step; ``False`` once the schedule is done (the profiler is stopped)."""
        if self._stopped:
            return False
        self.profiler.step()
        self._steps += 1
        total = self.schedule.total_steps if self.schedule is not None else None
        if total is not None and self._steps >= total:
            self.stop()
            return False
        return True

    def stop(self) -> None:
        """Stop the profiler (a cycle cut short by the end of training is still uploaded). Safe twice."""
        if self._stopped or self.profiler is None:
            return
        self._stopped = True
        self.profiler.stop()

    def _on_trace_ready(self, prof: Any) -> None:
        try:
            self.recorder.profile(self.build_record(prof))
            self.result.uploads += 1
        except Exception as exc:  # noqa: BLE001 - boundary: a failed summary must not stop training
            self.result.errors.append(f"{type(exc).__name__}: {exc}")
            log.warning("jobsight: could not summarise a profile window: %s", exc, exc_info=True)

    def build_record(self, prof: Any) -> dict[str, Any]:
        fd, path = tempfile.mkstemp(prefix="jobsight-trace-", suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, "rb") as handle:
                raw = handle.read()
        finally:
            os.unlink(path)
        events = json.loads(raw).get("traceEvents", [])
        times = breakdown(events)
        step_numbers = [
            int(str(e["name"]).split("#", 1)[1])
            for e in events
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
            and str(e["name"]).split("#", 1)[1].isdigit()
        ]
        if not step_numbers and self._steps:
            # No schedule, so no ProfilerStep markers: the steps are the ones counted here.
            step_numbers = list(range(self._steps))
        steps = len(set(step_numbers)) or 1
        summary = summarize(prof, steps)
        summary.update(self.extra)
        summary["breakdown"] = times
        summary["device"] = "cuda" if times.get("basis") == "device" else "cpu"
        memory = _memory_facts()
        if memory is not None:
            summary["memory"] = memory
        hints = diagnosis.diagnose(profile=summary)
        trace_b64: str | None = None
        note: str | None = "trace not kept (trace_cap_bytes=0)"
        if self.options.trace_cap_bytes > 0:
            trace_b64, note = pack_trace(raw, self.options.trace_cap_bytes)
        return {
            "profile_id": uuid.uuid4().hex,
            "request_id": self.request_id,
            "step_start": self.first_step + min(step_numbers) if step_numbers else None,
            "step_end": self.first_step + max(step_numbers) if step_numbers else None,
            "summary": summary,
            "diagnosis": hints,
            "trace_gz_b64": trace_b64,
            "note": note,
        }


# -- what callbacks drive ------------------------------------------------------------------------


class StepProfiling:
    """The configured window (``schedule`` on ``ranks``) and on-demand requests, one at a time.

    Hooks call :meth:`begin` once before the first step, :meth:`after_step` after every
    step and :meth:`close` at the end. None of them raises: a failure is warned about
    (rank zero) and profiling is off for the rest of the run.
    """

    def __init__(
        self,
        recorder: RunRecorder,
        schedule: ProfileSchedule | None = None,
        ranks: Sequence[int] | None = (0,),
        options: ProfileOptions | None = None,
        poller: DirectivePoller | None = None,
        extra: Mapping[str, Any] | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.recorder = recorder
        self.schedule = schedule
        self.ranks = ranks
        self.options = options or ProfileOptions()
        self.poller = poller
        self.extra = dict(extra or {})
        self._warn = warn or (lambda message: log.warning("%s", message))
        self.window: ProfileWindow | None = None
        self._request: ProfileRequest | None = None
        self._step = 0
        self._broken = False
        self.windows_run = 0

    def begin(self, step: int = 0) -> None:
        self._step = step
        if self.schedule is not None and rank_chosen(self.recorder.rank, self.ranks):
            self._open(ProfileWindow(self.recorder, self.schedule, self.options, first_step=step, extra=self.extra))

    def after_step(self, step: int | None = None) -> None:
        self._step = self._step + 1 if step is None else step
        window = self.window
        if window is None:
            poller = self.poller
            if poller is None or poller.pending is None or self._broken:
                return
            self._take_request(poller)
            return
        try:
            if not window.step():
                self._finished()
        except Exception as exc:  # noqa: BLE001 - boundary: profiling must not stop training
            self._fail(f"profiler step failed: {exc}")

    def close(self) -> None:
        """Stop a window of ours that is still running (its partial cycle is uploaded)."""
        window = self.window
        if window is None:
            return
        try:
            window.stop()
        except Exception as exc:  # noqa: BLE001 - boundary: never raise from teardown
            self._fail(f"profiler stop failed: {exc}")
            return
        self._finished(ended_early=True)

    def _open(self, window: ProfileWindow) -> bool:
        if self._broken:
            return False
        try:
            window.start()
        except Exception as exc:  # noqa: BLE001 - boundary: e.g. the user's own profiler is running
            self._broken = True
            self._warn(f"jobsight: profiling is off for this run: the torch profiler did not start ({exc})")
            if window.request_id is not None and self.poller is not None:
                self.poller.report(window.request_id, "failed", f"profiler did not start: {exc}")
            return False
        self.window = window
        return True

    def _take_request(self, poller: DirectivePoller) -> None:
        request = poller.take()
        if request is None:
            return
        if not rank_chosen(self.recorder.rank, request.ranks):
            return
        poller.report(request.id, "running")
        self._request = request
        schedule = ProfileSchedule(wait=0, warmup=1, active=request.steps, repeat=1)
        window = ProfileWindow(
            self.recorder, schedule, self.options, request_id=request.id, first_step=self._step, extra=self.extra
        )
        if not self._open(window):
            self._request = None

    def _finished(self, ended_early: bool = False) -> None:
        window, self.window = self.window, None
        request, self._request = self._request, None
        self.windows_run += 1
        if window is None:
            return
        if window.result.errors and self.poller is not None and request is not None:
            self.poller.report(request.id, "failed", "; ".join(window.result.errors)[:500])
        elif request is not None and self.poller is not None and window.result.uploads == 0:
            reason = "training ended before the profiled steps" if ended_early else "the window produced no trace"
            self.poller.report(request.id, "failed", reason)
        # A successful upload carries request_id; the collector marks the request done on ingest.

    def _fail(self, message: str) -> None:
        window, self.window = self.window, None
        self._broken = True
        if window is not None:
            try:
                window.stop()
            except Exception:  # noqa: BLE001 - boundary: already failing; stop is best-effort
                pass
        request, self._request = self._request, None
        if request is not None and self.poller is not None:
            self.poller.report(request.id, "failed", message[:500])
        self._warn(f"jobsight: profiling is off for this run: {message}")
