"""Plain PyTorch: a profiler that is real or a null object, and step/metric helpers.

The two lines::

    from jobsight.agent.training.torch import profiler, steps

    with profiler(enabled=args.profile) as prof:
        for batch in steps(loader):          # times data wait and compute of each step
            loss = model(batch).mean(); loss.backward(); opt.step(); opt.zero_grad()
            prof.step()

``profiler(enabled=True)`` returns a real ``torch.profiler.profile`` whose schedule
picks the window and whose ``on_trace_ready`` uploads each active cycle.
``enabled=False`` (or a rank not chosen) returns a :class:`NullProfiler`: the same
interface, and a ``step`` that only reads one attribute to learn whether an
on-demand profile was requested from the collector.

The profiler's ``with`` block (real or null) ends the run: it says so to the collector
(``run_end``, or ``exception`` when an exception left the block), which outside Slurm ends
the job once every process of it has ended. A helper used afterwards opens a new run, as the
last one was opened. A run still open when the process exits is ended then
(:mod:`~jobsight.agent.training.process_end`).

torch is imported when a profiler is built, never by importing this module.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from jobsight.agent.settings import AgentSettings
from jobsight.agent.training.profile_schedule import ProfileOptions, ProfileSchedule, check_ranks, rank_chosen
from jobsight.agent.training.profiling import ProfileWindow, StepProfiling
from jobsight.agent.training.run_records import TrainingRun, batch_size, open_run
from jobsight.agent.training.step_timer import StepTimer
from jobsight.protocol.run_events import EXCEPTION, RUN_END, RUN_START
from jobsight.protocol.step_phases import DATA, STEP

T = TypeVar("T")

_run: TrainingRun | None = None
_ended: TrainingRun | None = None
"""The run ended last, whose records :func:`finish` may still wait for."""
_opening: tuple[AgentSettings | None, bool, bool] = (None, True, True)
"""How the last run was opened (settings, on_demand, attach_logs): a helper used after a run ended
opens the next one the same way."""


def init(
    settings: AgentSettings | None = None,
    *,
    rank: int | None = None,
    on_demand: bool = True,
    attach_logs: bool = True,
) -> TrainingRun:
    """Set up this process's run (recorder, log handler, directive poller) and say it started. Called on
    first use of any helper with the defaults; call it first to pass settings. Returns the run."""
    global _run, _opening
    if _run is None:
        _opening = (settings, on_demand, attach_logs)
        _run = open_run(
            settings=settings, rank=rank, schedule=None, ranks=None, options=None, on_demand=on_demand,
            attach_logs=attach_logs, extra={"framework": "pytorch"},
        )
        # The collector counts this process among the run's until it says it ended (run_events).
        _run.recorder.event("run started", event=RUN_START, framework="pytorch")
    return _run


def _current() -> TrainingRun:
    """The process's run; after a profiler's ``with`` block ended it, a new one opened as it was."""
    run = _run
    if run is not None:
        return run
    settings, on_demand, attach_logs = _opening
    return init(settings, on_demand=on_demand, attach_logs=attach_logs)


def _end(run: TrainingRun, exc: BaseException | None, flush_timeout_s: float = 2.0) -> None:
    """End ``run`` (the process's current one, or one a profiler held): ``run_end``, or ``exception``
    when ``exc`` ended it. The health rules read this as "this rank is done", not hung; outside Slurm
    the collector ends the job once every process of it said so."""
    global _run, _ended
    if _run is run:
        _run = None
    _ended = run
    if exc is None:
        run.end("run finished", RUN_END, flush_timeout_s=flush_timeout_s)
    else:
        run.end(f"run ended by {type(exc).__name__}: {exc}", EXCEPTION, level="ERROR", exception=exc,
                flush_timeout_s=flush_timeout_s)


def finish(flush_timeout_s: float = 2.0) -> None:
    """End this process's run: stop an on-demand window still running, post request states, say the
    run ended and flush. Safe twice. After a profiler's ``with`` block ended the run, it waits up to
    ``flush_timeout_s`` for that run's last records (a profile's trace) to be delivered."""
    run = _run
    if run is not None:
        _end(run, None, flush_timeout_s)
    elif _ended is not None:
        _ended.recorder.flush(flush_timeout_s)


class NullProfiler:
    """The profiler's interface doing nothing, except serve on-demand requests when ``profiling`` is given.
    Made by :func:`profiler`, it holds the run, which its ``with`` block ends."""

    def __init__(self, profiling: StepProfiling | None = None, run: TrainingRun | None = None) -> None:
        self._profiling = profiling
        self._run = run

    def __enter__(self) -> NullProfiler:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._profiling is not None:
            self._profiling.close()
        if self._run is not None:
            _end(self._run, exc)

    def step(self) -> None:
        profiling = self._profiling
        if profiling is not None:
            profiling.after_step()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def profiler(
    enabled: bool = False,
    *,
    skip_first: int = 0,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    ranks: Sequence[int] | None = (0,),
    on_demand: bool = True,
    options: ProfileOptions | None = None,
    settings: AgentSettings | None = None,
) -> Any:
    """A real ``torch.profiler.profile`` over the schedule when ``enabled`` on a chosen rank
    (``ranks=None``: every rank), else a :class:`NullProfiler`. Bad arguments raise here."""
    schedule = ProfileSchedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    chosen = check_ranks(ranks)
    run = init(settings if settings is not None else _opening[0], on_demand=on_demand, attach_logs=_opening[2])
    if enabled and rank_chosen(run.recorder.rank, chosen):
        window = ProfileWindow(run.recorder, schedule, options or run.profiling.options, extra=run.profiling.extra)
        profile = window.build(_run_ending_profile())
        profile.jobsight_run = run
        return profile
    return NullProfiler(run.profiling if on_demand else None, run)


@functools.cache
def _run_ending_profile() -> type[Any]:
    """``torch.profiler.profile`` whose ``with`` block ends the run, as the null profiler's does
    (made on first use: importing this module does not import torch)."""
    from torch.profiler import profile

    class RunEndingProfile(profile):
        jobsight_run: TrainingRun | None = None

        def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                     tb: TracebackType | None) -> None:
            try:
                super().__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]
            finally:
                if self.jobsight_run is not None:
                    _end(self.jobsight_run, exc)

    return RunEndingProfile


def record_step(
    step: int,
    duration_s: float,
    *,
    data_wait_s: float | None = None,
    compute_s: float | None = None,
    samples: int | None = None,
    epoch: int | None = None,
    phase: str = "train",
) -> None:
    """One finished step (seconds); ``None`` for what was not measured."""
    _current().recorder.step(
        step, duration_s, epoch=epoch, phase=phase, data_wait_s=data_wait_s, compute_s=compute_s, samples=samples
    )


def record_metrics(values: Mapping[str, Any], step: int | None = None) -> None:
    """Metrics by name (floats, ints, 0-d tensors; non-finite values are skipped)."""
    _current().recorder.metrics(values, step)


def steps(
    batches: Iterable[T], *, epoch: int | None = None, start: int = 0, phase: str = "train"
) -> Iterator[T]:
    """Yield ``batches``, recording each step: data wait (the time ``next`` took) and compute
    (the loop body, until the next batch is asked for). Step numbers count from ``start``.
    The step watch learns whether the rank waits for its batch or is inside the loop body (which
    it cannot split into forward and backward)."""
    run = _current()
    recorder = run.recorder
    watch = run.watch
    iterator = iter(batches)
    timer = StepTimer()
    step = start
    try:
        while True:
            timer.ready()
            if watch is not None:
                watch.mark(step, DATA)
            try:
                batch = next(iterator)
            except StopIteration:
                return
            timer.arrived()
            if watch is not None:
                watch.mark(step, STEP)
            yield batch
            timing = timer.done()
            recorder.step(
                step, timing.duration_s, epoch=epoch, phase=phase, data_wait_s=timing.data_wait_s,
                compute_s=timing.compute_s, samples=batch_size(batch),
            )
            if watch is not None:
                watch.last_step_s = timing.duration_s
            step += 1
    finally:
        # The loop is over (or left by ``break``): what the rank does next is no step of ours.
        if watch is not None:
            watch.clear()
