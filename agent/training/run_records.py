"""The records a training process sends: steps, metrics, run events and profiles.

Framework callbacks (:mod:`~jobsight.agent.training.lightning`, :mod:`~jobsight.agent.training.keras`,
:mod:`~jobsight.agent.training.torch`) are thin: each hook hands its numbers to a
:class:`RunRecorder`, which builds wire records tagged with job, node, rank and pid
(events, which are ``log`` records, also carry the thread id) and enqueues them on the
shipper. ``enqueue`` never blocks or raises, so neither does anything here.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import traceback
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobsight.agent.settings import AgentSettings, load_agent_settings
from jobsight.agent.shipping.shipper import Shipper, get_shipper
from jobsight.agent.training import process_end
from jobsight.agent.training.context import RunContext, current_context, process_owner
from jobsight.agent.training.directives import DirectivePoller
from jobsight.agent.training.profile_schedule import ProfileOptions, ProfileSchedule
from jobsight.agent.training.profiling import StepProfiling
from jobsight.agent.training.step_watch import StepWatch
from jobsight.protocol import wire
from jobsight.protocol.json_safe import clip, json_safe

EVENT_LOGGER = "jobsight.run"
# The bounds the collector holds step fields to (jobsight.protocol.records): a value outside
# them would have the whole batch refused, so it is brought inside (or left out) here.
_SECONDS = wire.RANGES["step"]["duration_s"]
_METRIC = wire.RANGES["metric"]["value"]
_INT4 = wire.RANGES["step"]["samples"]


def _finite(value: Any) -> float | None:
    """``value`` as a float, or ``None`` when it is not a finite number (tensors included)."""
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _seconds(value: Any) -> float | None:
    """A duration inside the wire's bounds (a clock stepping back makes a negative one)."""
    number = _finite(value)
    return None if number is None else min(max(number, _SECONDS.lo), _SECONDS.hi)


def _int4(value: int | None) -> int | None:
    return value if value is None or _INT4.lo <= value <= _INT4.hi else None


class RunRecorder:
    """Builds and enqueues one training process's records.

    ``settings=None`` uses the environment and the process-wide shipper; explicit
    settings get a shipper of their own (tests, or a script talking to two collectors).
    ``rank`` overrides the rank read from the environment (a framework often knows better).
    """

    def __init__(self, settings: AgentSettings | None = None, rank: int | None = None) -> None:
        if settings is None:
            self.settings = load_agent_settings()
            self.shipper: Shipper = get_shipper(self.settings)
            self._own_shipper = False
        else:
            self.settings = settings
            self.shipper = Shipper(settings)
            self._own_shipper = True
        context = current_context(self.settings)
        self.context: RunContext = context
        self.rank: int | None = rank if rank is not None else context.rank
        self.pid = os.getpid()

    def set_rank(self, rank: int | None) -> None:
        if rank is not None:
            self.rank = rank

    def _base(self, kind: str, ts: int | None = None) -> dict[str, Any]:
        return {"kind": kind, "job": self.context.job, "ts": ts or wire.now_us(), "node": self.context.node}

    def step(
        self,
        step: int,
        duration_s: float,
        *,
        epoch: int | None = None,
        phase: str = "train",
        data_wait_s: float | None = None,
        compute_s: float | None = None,
        samples: int | None = None,
        forward_s: float | None = None,
    ) -> None:
        """One finished step; ``data_wait_s``/``compute_s``/``forward_s`` ``None`` means not
        measurable here."""
        record = self._base("step")
        record.update(
            rank=self.rank, pid=self.pid, tid=threading.get_native_id(), step=int(step), epoch=_int4(epoch),
            phase=clip(phase, wire.MAX_STRING) if phase is not None else None,
            duration_s=_seconds(duration_s) or 0.0, data_wait_s=_seconds(data_wait_s), compute_s=_seconds(compute_s),
            samples=_int4(samples), forward_s=_seconds(forward_s),
        )
        self.shipper.enqueue(record)

    def metrics(self, values: Mapping[str, Any], step: int | None = None) -> None:
        """Each finite number in ``values`` (within the wire's bounds) as a ``metric`` record; the
        rest are skipped."""
        ts = wire.now_us()
        tid = threading.get_native_id()
        for name, raw in values.items():
            value = _finite(raw)
            if value is None or not _METRIC.lo <= value <= _METRIC.hi:
                continue  # what the collector would refuse would take the whole batch with it
            record = self._base("metric", ts)
            record.update(
                rank=self.rank, pid=self.pid, tid=tid, step=step, name=clip(str(name), wire.MAX_STRING), value=value
            )
            self.shipper.enqueue(record)

    def event(
        self, message: str, *, level: str = "INFO", exception: BaseException | None = None, **attrs: Any
    ) -> None:
        """A run event (fit start, epoch end, checkpoint, failure) as a ``log`` record."""
        record = self._base("log")
        text = None
        if exception is not None:
            text = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
            text = clip(text, wire.MAX_MESSAGE, tail=True)  # a traceback's end says the most
        record.update(
            rank=self.rank, pid=self.pid, tid=threading.get_native_id(),
            thread=clip(threading.current_thread().name, wire.MAX_STRING), level=clip(str(level), wire.MAX_STRING),
            logger=EVENT_LOGGER, message=clip(str(message), wire.MAX_MESSAGE), exception=text,
            attrs=json_safe(attrs) if attrs else None,
        )
        self.shipper.enqueue(record)

    def run_started(self, *, demo: bool = False, name: str | None = None, attrs: Mapping[str, Any]) -> None:
        """The run's metadata on the job (``job_started`` merges ``attrs`` into the job's), with the
        process's owner under ``process`` (:func:`~jobsight.agent.training.context.process_owner`).
        In ``attrs``, not the job's ``user``: that is Slurm's accounting, which a job token may not set."""
        record = self._base("job_started")
        record.update(
            demo=demo, name=clip(str(name), wire.MAX_STRING) if name is not None else None,
            attrs=json_safe({"process": process_owner(), **attrs}),
        )
        self.shipper.enqueue(record)

    def profile(self, record: dict[str, Any]) -> None:
        """A ready ``profile`` record from :mod:`~jobsight.agent.training.profiling` (job, node, rank and pid
        filled in here). Its summary and hints come from a profiler's op names and the run's ``extra``:
        they go through ``json_safe`` like any other value of the user's."""
        record.update(self._base("profile"))
        record.update(rank=self.rank, pid=self.pid, summary=json_safe(record.get("summary") or {}))
        if record.get("diagnosis") is not None:
            record["diagnosis"] = json_safe(record["diagnosis"])
        self.shipper.enqueue(record)

    def flush(self, timeout: float = 2.0) -> bool:
        return self.shipper.flush(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Flush; a shipper of our own is shut down too (the process-wide one is left to ``atexit``)."""
        if self._own_shipper:
            self.shipper.shutdown(timeout)
        else:
            self.shipper.flush(timeout)


def batch_size(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor-like leaf; ``None`` when unknown."""
    for _ in range(4):
        shape = getattr(batch, "shape", None)
        if shape is not None:
            try:
                return int(shape[0]) if len(shape) else None
            except (TypeError, ValueError, IndexError):
                return None
        if isinstance(batch, Mapping):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        else:
            return None
    return None


def warn_rank_zero(rank: int | None, message: str) -> None:
    """A user-facing warning, from rank zero only (CONTRIBUTING rule 11)."""
    if not rank:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


@dataclass
class TrainingRun:
    """What a callback holds for one run: its recorder, its profiling, the directive poller and
    the watch on its pending step."""

    recorder: RunRecorder
    profiling: StepProfiling
    poller: DirectivePoller | None
    handler: logging.Handler | None = None
    """A log handler of this run's own (explicit settings); removed at close."""
    watch: StepWatch | None = None
    """Where the rank is inside its step, reported when it stays there long."""
    ended: bool = False
    """Its end event was sent (:meth:`end`)."""

    def mark(self, step: int, phase: str) -> None:
        """The rank enters ``phase`` (``jobsight.protocol.step_phases``) of step ``step``."""
        watch = self.watch
        if watch is not None:
            watch.mark(step, phase)

    @property
    def pid(self) -> int:
        """The process whose run this is: the pid its records carry (a forked child's is another)."""
        return self.recorder.pid

    def end(self, message: str, event: str, *, level: str = "INFO", exception: BaseException | None = None,
            flush_timeout_s: float = 2.0, **attrs: Any) -> None:
        """Send the run's end event (:data:`jobsight.protocol.run_events.END_EVENTS`), then close. Only the
        first call sends; later ones (the process's exit after a callback's end hook) do nothing. Never raises."""
        if self.ended:
            return
        self.ended = True
        process_end.untrack(self)
        try:
            self.recorder.event(message, level=level, exception=exception, event=event, **attrs)
        except Exception:  # noqa: BLE001 - boundary: ending telemetry must not fail the job
            pass
        self.close(flush_timeout_s)

    def close(self, flush_timeout_s: float = 2.0) -> None:
        """Stop a window of ours, post pending request states, flush. Never raises."""
        try:
            if self.watch is not None:
                self.watch.stop()
            self.profiling.close()
            if self.poller is not None:
                self.poller.stop(flush_timeout_s)
            if self.handler is not None:
                logging.getLogger().removeHandler(self.handler)
            self.recorder.close(flush_timeout_s)
        except Exception:  # noqa: BLE001 - boundary: closing telemetry must not fail the job
            pass


def open_run(
    *,
    settings: AgentSettings | None,
    rank: int | None,
    schedule: ProfileSchedule | None,
    ranks: Sequence[int] | None,
    options: ProfileOptions | None,
    on_demand: bool,
    attach_logs: bool,
    extra: Mapping[str, Any],
) -> TrainingRun:
    """Recorder, log handler, in-process GPU sampler (when the node has no daemon), directive poller,
    profiling and the step watch for one training process. Never raises for telemetry trouble."""
    recorder = RunRecorder(settings, rank=rank)
    handler: logging.Handler | None = None
    if attach_logs:
        from jobsight.agent.training.logs import JobsightHandler, attach

        if recorder._own_shipper:
            # Explicit settings: this run's lines go to this run's collector, not the process-wide one.
            handler = JobsightHandler(logging.INFO, recorder.settings, recorder.shipper)
            root = logging.getLogger()
            root.addHandler(handler)
            if root.level > logging.INFO:
                root.setLevel(logging.INFO)
        else:
            attach(settings=recorder.settings)
    try:
        from jobsight.agent.training.gpu_sampler import start_inprocess_sampler

        shipper = recorder.shipper if recorder._own_shipper else None
        start_inprocess_sampler(recorder.settings, recorder.context, shipper=shipper)
    except Exception:  # noqa: BLE001 - boundary: GPU sampling is optional (no module, no NVML)
        pass
    poller = None
    if on_demand:
        poller = DirectivePoller(recorder.settings, recorder.context.job, recorder.rank)
        poller.start()
    profiling = StepProfiling(
        recorder, schedule, ranks, options, poller, extra, warn=lambda message: warn_rank_zero(recorder.rank, message)
    )
    watch = StepWatch(recorder, recorder.settings.phase_report_s)
    watch.start()
    run = TrainingRun(recorder, profiling, poller, handler, watch)
    process_end.track(run)  # ended at the process's exit, if nothing ends it before
    return run
