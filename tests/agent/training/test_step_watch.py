"""The step watch: phase marks cost an attribute write, and only a phase that lasts is said, once."""

from __future__ import annotations

import time
from typing import Any

from jobsight.agent.training.step_watch import StepWatch
from jobsight.protocol.step_phases import BACKWARD, DATA, FORWARD, PHASE_EVENT, PendingPhase, parse


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Events:
    """Collects what the watch would send (the RunRecorder's ``event`` signature)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def event(self, message: str, *, level: str = "INFO", exception: BaseException | None = None,
              **attrs: object) -> None:
        self.sent.append((message, dict(attrs)))


def test_a_phase_is_reported_once_when_it_lasts_and_a_busy_loop_reports_nothing() -> None:
    clock, events = Clock(), Events()
    watch = StepWatch(events, report_after_s=30.0, clock=clock)
    for step in range(100):  # healthy steps of 0.5 s: phases change long before 30 s
        for phase in (DATA, FORWARD, BACKWARD):
            watch.mark(step, phase)
            clock.now += 0.5 / 3
            assert not watch.check()
        watch.last_step_s = 0.5
    watch.mark(100, FORWARD)
    since = clock.now
    clock.now += 29.0
    assert not watch.check()
    clock.now += 2.0
    assert watch.check() and not watch.check(), "once per phase"
    assert events.sent == [("step 100 has been in its forward pass for 31 s",
                            {"event": PHASE_EVENT, "step": 100, "phase": "forward", "since_us": round(since * 1e6)})]
    back = parse(events.sent[0][1])
    assert back is not None and (back.step, back.phase) == (100, FORWARD) and abs(back.since - since) < 1e-6
    # The next phase is a new one: reported again when it lasts too.
    watch.mark(100, BACKWARD)
    clock.now += 31.0
    assert watch.check() and len(events.sent) == 2
    # Cleared (a plain loop ended): nothing to say.
    watch.clear()
    clock.now += 100
    assert not watch.check()


def test_slow_steps_raise_the_bar_to_three_of_them() -> None:
    clock, events = Clock(), Events()
    watch = StepWatch(events, report_after_s=30.0, clock=clock)
    watch.last_step_s = 60.0  # a model whose backward alone takes 40 s is not stuck in it
    watch.mark(5, BACKWARD)
    clock.now += 170.0
    assert not watch.check()
    clock.now += 11.0
    assert watch.check()


def test_the_thread_reports_a_stuck_step_and_stops() -> None:
    events = Events()
    watch = StepWatch(events, report_after_s=0.2)
    watch.start()
    try:
        watch.mark(3, FORWARD)
        deadline = time.monotonic() + 5
        while not events.sent and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    assert [attrs["step"] for _, attrs in events.sent] == [3]


def test_parse_trusts_nothing_a_job_wrote() -> None:
    good = {"event": PHASE_EVENT, "step": 4, "phase": "backward", "since_us": 1_800_000_000_000_000}
    assert parse(good) == PendingPhase(4, BACKWARD, 1_800_000_000.0)
    for bad in ({**good, "phase": "<!channel>"}, {**good, "step": -1}, {**good, "step": True}, {**good, "step": "4"},
                {**good, "since_us": None}, {**good, "since_us": float("nan")}, {**good, "event": "fit_end"},
                [good], None):
        assert parse(bad) is None
