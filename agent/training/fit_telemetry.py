"""What every framework callback does, written once: open the run, time each step, record
epochs and validation, warn once on rank zero, close the run.

The Keras and Lightning callbacks are thin adapters: each framework hook calls one method
here. Configuration is checked when :class:`CallbackOptions` is made (it fails there, in
the callback's ``__init__``); after that nothing here raises (CONTRIBUTING rule 11).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from jobsight.agent.settings import AgentSettings
from jobsight.agent.training.profile_schedule import ProfileOptions, ProfileSchedule
from jobsight.agent.training.run_records import TrainingRun, open_run, warn_rank_zero
from jobsight.agent.training.step_timer import StepTimer
from jobsight.protocol.run_events import FIT_START
from jobsight.protocol.step_phases import BACKWARD, DATA, OPTIMIZER, STEP, VALIDATION


class CallbackKeywords(TypedDict, total=False):
    """The keywords every callback takes besides its own (``**options: Unpack[CallbackKeywords]``)."""

    on_demand: bool
    logs: bool
    settings: AgentSettings | None
    demo: bool
    run_name: str | None
    flush_timeout_s: float


@dataclass(frozen=True)
class CallbackOptions:
    """What every callback takes. ``on_demand``: poll the collector for profile requests.
    ``logs``: attach the log handler to the root logger. ``settings``: explicit agent settings
    (default: the environment). ``demo``/``run_name`` label the job."""

    on_demand: bool = True
    logs: bool = True
    settings: AgentSettings | None = None
    demo: bool = False
    run_name: str | None = None
    flush_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if self.flush_timeout_s < 0:
            raise ValueError("flush_timeout_s must be >= 0")


class FitTelemetry:
    """One fit's telemetry. ``run`` is ``None`` until :meth:`open` and after :meth:`close`,
    or when set-up failed (the fit then runs without telemetry)."""

    def __init__(self, options: CallbackOptions) -> None:
        self.options = options
        self.run: TrainingRun | None = None
        self.timer = StepTimer()
        self.batches = 0
        """Training batches finished on this rank; the next step's number."""
        self._val_start = 0.0
        self._failed = False

    # -- life cycle ----------------------------------------------------------------------------

    def open(
        self,
        *,
        rank: int | None,
        extra: Mapping[str, Any],
        schedule: ProfileSchedule | None = None,
        ranks: Sequence[int] | None = None,
        profile_options: ProfileOptions | None = None,
    ) -> TrainingRun | None:
        if self.run is None:
            try:
                self.run = open_run(
                    settings=self.options.settings, rank=rank, schedule=schedule, ranks=ranks, options=profile_options,
                    on_demand=self.options.on_demand, attach_logs=self.options.logs, extra=extra,
                )
            except Exception as exc:  # noqa: BLE001 - boundary: no telemetry rather than no training
                warn_rank_zero(rank, f"jobsight: telemetry is off for this run ({exc!r})")
        return self.run

    def started(self, meta: Mapping[str, Any], message: str, **attrs: Any) -> None:
        """The run's metadata on the job (from rank zero) and this rank's start event."""
        run = self.run
        if run is None:
            return
        if not run.recorder.rank:
            run.recorder.run_started(demo=self.options.demo, name=self.options.run_name, attrs={"run": meta})
        run.recorder.event(message, event=FIT_START, **attrs)

    def close(self, message: str, event: str) -> None:
        """The end event, then the run flushed and closed. Safe twice."""
        run, self.run = self.run, None
        if run is not None:
            run.end(message, event, flush_timeout_s=self.options.flush_timeout_s, batches=self.batches)

    def warn_once(self, what: str, exc: BaseException) -> None:
        """A hook failed: warned about once, on rank zero; the fit goes on."""
        if not self._failed:
            self._failed = True
            rank = self.run.recorder.rank if self.run is not None else None
            warn_rank_zero(rank, f"jobsight: {what} failed ({exc!r}); telemetry may be incomplete")

    # -- steps, epochs, validation ----------------------------------------------------------------

    def _mark(self, phase: str) -> None:
        """Where the rank is in its pending step (``step_watch``): an attribute write, nothing sent."""
        run = self.run
        if run is not None:
            run.mark(self.batches, phase)

    def epoch_started(self) -> None:
        self.timer.epoch_started()
        self._mark(DATA)

    def batch_started(self, phase: str = STEP) -> None:
        """The batch is in hand; ``phase``: where the step starts, as far as the framework tells
        (Lightning: the forward pass; Keras: its compiled ``train_step``, not split)."""
        self.timer.arrived()
        self._mark(phase)

    def backward_started(self) -> None:
        self.timer.backward()
        self._mark(BACKWARD)

    def backward_ended(self) -> None:
        """Backward, and with it DDP's gradient all-reduce, is done: the optimizer step follows."""
        self._mark(OPTIMIZER)

    def batch_ended(self, epoch: int, samples: int | None = None) -> TrainingRun | None:
        """Record the step that just ended; returns the run for the caller's own per-step work
        (metrics, profiling), ``None`` when telemetry is off."""
        step = self.timer.done()
        run = self.run
        if run is None:
            return None
        run.recorder.step(self.batches, step.duration_s, epoch=epoch, data_wait_s=step.data_wait_s,
                          compute_s=step.compute_s, samples=samples, forward_s=step.forward_s)
        if run.watch is not None:
            run.watch.last_step_s = step.duration_s
        self.batches += 1
        return run

    def between_steps(self) -> None:
        """Hook work, validation or a checkpoint is over: the next batch's wait starts now."""
        self.timer.ready()
        self._mark(DATA)

    def epoch_ended(
        self, epoch: int, metrics: Mapping[str, Any], step: int | None, duration_s: float | None = None
    ) -> None:
        """``duration_s``: the epoch's length when the caller measured it (before stopping a
        profiler, say); by default from the epoch's start until now."""
        run = self.run
        if run is None:
            return
        duration = self.timer.since_epoch_start() if duration_s is None else duration_s
        run.recorder.metrics(metrics, step)
        run.recorder.event(f"epoch {epoch} ended", event="epoch_end", epoch=epoch, duration_s=round(duration, 6),
                           batches=self.batches)

    def validation_started(self) -> None:
        self._val_start = self.timer.now()
        self._mark(VALIDATION)

    def validation_ended(self, epoch: int, metrics: Mapping[str, Any] | None, step: int | None) -> None:
        run = self.run
        if run is None:
            return
        duration = self.timer.now() - self._val_start
        if metrics is not None:
            run.recorder.metrics(metrics, step)
        run.recorder.event(f"validation after epoch {epoch} took {duration:.2f} s", event="validation_end",
                           epoch=epoch, duration_s=round(duration, 6), step=self.batches)
        self.between_steps()
