"""Where this rank is inside its pending step, said only when it stays there long.

The training thread marks each phase as it enters it (:meth:`StepWatch.mark`: one tuple
assigned, no record, no lock), so the hot path costs what an attribute write costs. A daemon
thread looks every third of ``phase_report_s`` and, when the same mark has stood for
``phase_report_s`` and three of the rank's last step (so a healthy run of slow steps stays
quiet), sends it once as a run event (:data:`~jobsight.protocol.step_phases.PHASE_EVENT`).
A rank stuck in its step sends no more step records, but this thread still runs: the collector
learns that rank 1 is still in its forward pass while rank 0 waits in backward's all-reduce.

A process stuck where Python cannot run at all (a C call holding the GIL) says nothing; the
hung rule then falls back to which rank stopped first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

from jobsight.protocol.step_phases import SHORT, PendingPhase

STEP_FACTOR: Final = 3.0
"""A phase is reported once it lasts this many of the rank's last step (and ``phase_report_s``)."""


class EventSink(Protocol):
    """What sends a run event (:class:`~jobsight.agent.training.run_records.RunRecorder`)."""

    def event(self, message: str, *, level: str = "INFO", exception: BaseException | None = None,
              **attrs: object) -> None: ...


class StepWatch:
    """The latest phase mark of one training process, and the thread that reports a long one."""

    def __init__(self, sink: EventSink, report_after_s: float, clock: Callable[[], float] = time.time) -> None:
        self._sink = sink
        self.report_after_s = report_after_s
        self._clock = clock
        # A plain tuple (step, phase, since): the cheapest thing to build on every mark.
        self._at: tuple[int, str, float] | None = None
        self._reported: tuple[int, str, float] | None = None
        self.last_step_s = 0.0
        """The duration of the rank's last step, set by the integration after each step."""
        self.reports = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def mark(self, step: int, phase: str) -> None:
        """The rank enters ``phase`` of step ``step`` now (the training thread; never raises)."""
        self._at = (step, phase, self._clock())

    def clear(self) -> None:
        """The rank is outside any step (its loop is over): nothing to report."""
        self._at = None

    def check(self) -> bool:
        """Report the current mark if it has stood long enough and was not reported yet; ``True``
        when it was (the thread's look, also called by tests)."""
        mark = self._at
        if mark is None or mark is self._reported:
            return False
        at = PendingPhase(*mark)
        stood = self._clock() - at.since
        if stood < max(self.report_after_s, STEP_FACTOR * self.last_step_s):
            return False
        self._reported = mark
        self.reports += 1
        self._sink.event(f"step {at.step} has been in {SHORT[at.phase]} for {stood:.0f} s", **at.attrs())
        return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="jobsight-step-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        period = max(self.report_after_s / 3, 0.05)
        while not self._stop.wait(period):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - boundary: the watch never disturbs training
                pass

    def stop(self, timeout: float = 1.0) -> None:
        """End the thread; safe twice."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
