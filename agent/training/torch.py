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

torch is imported when a profiler is built, never by importing this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from jobsight.agent.settings import AgentSettings
from jobsight.agent.training.profile_schedule import ProfileOptions, ProfileSchedule, check_ranks, rank_chosen
from jobsight.agent.training.profiling import ProfileWindow, StepProfiling
from jobsight.agent.training.run_records import TrainingRun, batch_size, open_run
from jobsight.agent.training.step_timer import StepTimer
from jobsight.protocol.step_phases import DATA, STEP

T = TypeVar("T")

_run: TrainingRun | None = None


def init(
    settings: AgentSettings | None = None,
    *,
    rank: int | None = None,
    on_demand: bool = True,
    attach_logs: bool = True,
) -> TrainingRun:
    """Set up this process's run (recorder, log handler, directive poller). Called on first use
    of any helper with the defaults; call it first to pass settings. Returns the run."""
    global _run
    if _run is None:
        _run = open_run(
            settings=settings, rank=rank, schedule=None, ranks=None, options=None, on_demand=on_demand,
            attach_logs=attach_logs, extra={"framework": "pytorch"},
        )
    return _run


def finish(flush_timeout_s: float = 2.0) -> None:
    """Stop an on-demand window still running, post request states and flush. Safe twice."""
    global _run
    run, _run = _run, None
    if run is not None:
        # The health rules read this as "this rank is done", not hung.
        run.recorder.event("run finished", event="run_end")
        run.close(flush_timeout_s)


class NullProfiler:
    """The profiler's interface doing nothing, except serve on-demand requests when ``profiling`` is given."""

    def __init__(self, profiling: StepProfiling | None = None) -> None:
        self._profiling = profiling

    def __enter__(self) -> NullProfiler:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._profiling is not None:
            self._profiling.close()

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
    run = init(settings, on_demand=on_demand)
    if enabled and rank_chosen(run.recorder.rank, chosen):
        window = ProfileWindow(run.recorder, schedule, options or run.profiling.options, extra=run.profiling.extra)
        return window.build()
    return NullProfiler(run.profiling if on_demand else None)


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
    init().recorder.step(
        step, duration_s, epoch=epoch, phase=phase, data_wait_s=data_wait_s, compute_s=compute_s, samples=samples
    )


def record_metrics(values: Mapping[str, Any], step: int | None = None) -> None:
    """Metrics by name (floats, ints, 0-d tensors; non-finite values are skipped)."""
    init().recorder.metrics(values, step)


def steps(
    batches: Iterable[T], *, epoch: int | None = None, start: int = 0, phase: str = "train"
) -> Iterator[T]:
    """Yield ``batches``, recording each step: data wait (the time ``next`` took) and compute
    (the loop body, until the next batch is asked for). Step numbers count from ``start``.
    The step watch learns whether the rank waits for its batch or is inside the loop body (which
    it cannot split into forward and backward)."""
    run = init()
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
