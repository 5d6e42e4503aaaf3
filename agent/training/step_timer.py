"""How long each training step took, split into data wait and compute, framework-neutral.

Every integration marks the same three moments: the loop is *ready* for the next batch,
the batch has *arrived* (the framework's batch-start hook, or ``next()`` returning), and
the step is *done* (batch-end hook, or the loop body handing control back). Data wait is
ready → arrived, compute is arrived → done. Time spent between steps in hooks, validation
or checkpoints is not the next batch's wait: call :meth:`StepTimer.ready` after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StepTime:
    duration_s: float
    data_wait_s: float
    compute_s: float
    forward_s: float | None = None
    """Arrival to backward start, when the integration marked it (:meth:`StepTimer.backward`)."""


class StepTimer:
    """Marks of one training loop; ``clock`` is a parameter so tests can drive it."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._ready = self._arrived = self._epoch_start = clock()
        self._backward: float | None = None

    def epoch_started(self) -> None:
        """A new epoch: its duration counts from now, and so does the first batch's wait."""
        self._epoch_start = self._ready = self._clock()

    def ready(self) -> None:
        """The loop asks for the next batch now."""
        self._ready = self._clock()

    def arrived(self) -> None:
        """The batch is in hand; the step's compute starts."""
        self._arrived = self._clock()
        self._backward = None

    def backward(self) -> None:
        """Backward starts now (the first call of a step counts: gradient accumulation or a
        second loss calls it again)."""
        if self._backward is None:
            self._backward = self._clock()

    def done(self) -> StepTime:
        """The step ended now: its data wait, compute and their sum."""
        now = self._clock()
        wait = max(0.0, self._arrived - self._ready)
        compute = now - self._arrived
        forward = None if self._backward is None else self._backward - self._arrived
        return StepTime(wait + compute, wait, compute, forward)

    def since_epoch_start(self) -> float:
        return self._clock() - self._epoch_start

    def now(self) -> float:
        """The timer's clock, for spans outside steps (validation)."""
        return self._clock()
