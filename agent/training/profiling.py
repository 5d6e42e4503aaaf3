"""Profiling windows over training steps, framework-neutral.

A :class:`ProfileWindow` runs the torch profiler over a step schedule
(skip_first, wait, warmup, active, repeat); each active cycle becomes one ``profile``
record: a compact summary (top ops, the user's source lines behind the most called ones, a
time breakdown, step times), the diagnosis of :mod:`jobsight.protocol.diagnosis`, and the
Chrome/Kineto trace gzipped under a size cap. :class:`StepProfiling` is what callbacks drive:
the configured window on chosen ranks plus on-demand requests from
:mod:`jobsight.agent.training.directives`. When neither is active its ``after_step`` reads one
attribute and returns.

The schedule and options are :mod:`jobsight.agent.training.profile_schedule` (``with_stack``
on: Python frames are recorded in the window only); the summary's content (breakdown, top
ops, memory) is :mod:`jobsight.agent.traces.profile_summary`, its source lines
:mod:`jobsight.agent.traces.profile_sources`. torch is imported only when a window starts:
``agent`` imports without it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from jobsight.agent.traces.profile_summary import breakdown, memory_facts, summarize
from jobsight.agent.traces.trace_packing import pack_trace
from jobsight.agent.training.profile_schedule import (
    ProfileOptions,
    ProfileSchedule,
    rank_chosen,
)
from jobsight.protocol import diagnosis

if TYPE_CHECKING:
    from jobsight.agent.shipping.directives import ProfileRequest
    from jobsight.agent.training.directives import DirectivePoller


class Recorder(Protocol):
    """What profiling needs of the run it profiles (a :class:`~jobsight.agent.training.run_records.RunRecorder`,
    which itself holds a :class:`StepProfiling`): the rank, and where a profile record goes."""

    rank: int | None

    def profile(self, record: dict[str, Any]) -> None: ...

log = logging.getLogger("jobsight.agent.profiling")


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
        recorder: Recorder,
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

    def build(self, profile_type: type[Any] | None = None) -> Any:
        """Make the torch profiler (not started): for a caller that enters it with ``with``.
        ``profile_type``: a subclass of ``torch.profiler.profile`` to make (``None``: that class)."""
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        make = profile_type or profile
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        s = self.schedule
        self.profiler = make(
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
        summary["world_size"] = _world_size()
        memory = memory_facts()
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


def _world_size() -> int | None:
    """The process group's size; ``None`` outside torch.distributed (one rank's profile of a
    distributed run is read differently: waiting in collectives may be waiting for a slow rank)."""
    import torch.distributed as dist

    return int(dist.get_world_size()) if dist.is_available() and dist.is_initialized() else None


# -- what callbacks drive ------------------------------------------------------------------------


class StepProfiling:
    """The configured window (``schedule`` on ``ranks``) and on-demand requests, one at a time.

    Hooks call :meth:`begin` once before the first step, :meth:`after_step` after every
    step and :meth:`close` at the end. None of them raises: a failure is warned about
    (rank zero) and profiling is off for the rest of the run.
    """

    def __init__(
        self,
        recorder: Recorder,
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
