"""The one step timer the Lightning, Keras and torch integrations share."""

from __future__ import annotations

from jobsight.agent.training.step_timer import StepTimer


class Clock:
    """A clock the test moves by hand (the timer takes its clock as a parameter)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_wait_and_compute_of_each_step() -> None:
    clock = Clock()
    timer = StepTimer(clock)
    timer.epoch_started()
    clock.now += 0.25  # the first batch is fetched
    timer.arrived()
    clock.now += 1.0  # forward, backward, optimizer
    first = timer.done()
    assert (first.data_wait_s, first.compute_s, first.duration_s) == (0.25, 1.0, 1.25)

    clock.now += 3.0  # validation between steps is nobody's data wait
    timer.ready()
    clock.now += 0.5
    timer.arrived()
    clock.now += 2.0
    second = timer.done()
    assert (second.data_wait_s, second.compute_s) == (0.5, 2.0)
    assert timer.since_epoch_start() == clock.now - 100.0
