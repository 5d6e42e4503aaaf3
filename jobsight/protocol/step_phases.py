"""Where a rank is inside the step it has not finished, and what that says when no rank steps.

A training process marks the phases of each step as it enters them (an attribute write on the
hot path, nothing sent: ``agent/training/step_watch.py``). Only when a rank stays in one phase
long (the agent's ``JOBSIGHT_PHASE_REPORT_S``, and three of its last step's time) does a thread of
its own say so, once, as a ``log`` record whose ``attrs`` are ``{"event": PHASE_EVENT, "step",
"phase", "since_us"}``. A stuck rank cannot send a step record, but this thread still runs, so the
collector learns where every rank of a hung job stopped (:func:`behind`).

Why it matters: in synchronous data-parallel training every rank stops at the same step when one
is stuck, because the others wait for it in the gradient all-reduce (inside backward). Their last
steps end together, so "who stopped first" is a coin toss; where each rank *is* is not: the stuck
rank is still in its forward pass (or waiting for its batch) while the others are in backward.

Standard library only; the collector reads it from records a job wrote, so :func:`parse` trusts
nothing in them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

PHASE_EVENT: Final = "step_phase"
"""``attrs.event`` of the log record that says where a rank has stayed long."""

DATA: Final = "data"
FORWARD: Final = "forward"
BACKWARD: Final = "backward"
OPTIMIZER: Final = "optimizer"
STEP: Final = "step"
"""Inside the step, where the integration cannot tell (Keras's compiled ``train_step``, a plain
PyTorch loop body)."""
VALIDATION: Final = "validation"

ORDER: Final[Mapping[str, int]] = {DATA: 0, FORWARD: 1, BACKWARD: 2, OPTIMIZER: 3}
"""The phases of one training step, in the order a rank goes through them. :data:`STEP` and
:data:`VALIDATION` are not placed: a rank in one of them cannot be said to be ahead or behind."""
COLLECTIVE: Final = frozenset({BACKWARD, OPTIMIZER})
"""Phases reached only by passing the step's forward: DDP's gradient all-reduce runs in backward
and is done once it ends."""
PHASES: Final = (*ORDER, STEP, VALIDATION)

SHORT: Final[Mapping[str, str]] = {  # "step 57 has been in <this> for 31 s"
    DATA: "the wait for its batch", FORWARD: "its forward pass", BACKWARD: "backward", OPTIMIZER: "its optimizer step",
    STEP: "its training step", VALIDATION: "validation",
}

_PLACE: Final[Mapping[str, str]] = {
    DATA: "waiting for the batch of step {step}",
    FORWARD: "in the forward pass of step {step}",
    BACKWARD: "in backward of step {step}, in its gradient all-reduce",
    OPTIMIZER: "past backward of step {step} and its all-reduce, in the optimizer step",
    STEP: "inside step {step}",
    VALIDATION: "in validation before step {step}",
}
_MAX_STEP: Final = 2**63 - 1


@dataclass(frozen=True)
class PendingPhase:
    """Where one rank is: the phase of its unfinished step ``step``, entered at ``since``."""

    step: int
    phase: str
    since: float
    """Seconds since the epoch (the rank's own clock)."""

    def attrs(self) -> dict[str, Any]:
        """The log record's ``attrs`` that carry it (the inverse of :func:`parse`)."""
        return {"event": PHASE_EVENT, "step": self.step, "phase": self.phase, "since_us": round(self.since * 1e6)}


def parse(attrs: Any) -> PendingPhase | None:
    """The phase a log record's ``attrs`` carry, or ``None`` when they carry none that makes sense:
    what a job sends is not trusted (an unknown phase never reaches a finding's words)."""
    if not isinstance(attrs, Mapping) or attrs.get("event") != PHASE_EVENT:
        return None
    step, phase, since_us = attrs.get("step"), attrs.get("phase"), attrs.get("since_us")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _MAX_STEP:
        return None
    if phase not in PHASES or isinstance(since_us, bool) or not isinstance(since_us, (int, float)):
        return None
    if not math.isfinite(since_us) or since_us < 0:
        return None
    return PendingPhase(step, str(phase), since_us / 1e6)


@dataclass(frozen=True)
class Behind:
    """Who holds a job where no rank steps, read from the ranks' phases."""

    behind: tuple[int, ...]
    """The ranks furthest behind: the others reached a point they never did."""
    ahead: tuple[int, ...]
    """The other ranks; with DDP they wait for ``behind`` in a collective."""


def behind(phases: Mapping[int, PendingPhase]) -> Behind | None:
    """The ranks the others wait for, when the phases say so: every rank's phase is placed
    (:data:`ORDER`) and not all are at the same point; ``None`` otherwise."""
    if len(phases) < 2 or any(p.phase not in ORDER for p in phases.values()):
        return None
    where = {rank: (p.step, ORDER[p.phase]) for rank, p in phases.items()}
    last = min(where.values())
    if last == max(where.values()):
        return None
    return Behind(tuple(sorted(r for r, w in where.items() if w == last)),
                  tuple(sorted(r for r, w in where.items() if w != last)))


def place(p: PendingPhase) -> str:
    """Where a rank is, as words for a finding: "in the forward pass of step 57"."""
    return _PLACE[p.phase].format(step=p.step)


def rank_list(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0, 2`` or ``ranks 0–10, 12–15``: runs joined, for a message."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    words = [str(run[0]) if len(run) == 1 else f"{run[0]}, {run[1]}" if len(run) == 2 else f"{run[0]}–{run[-1]}"
             for run in runs]
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(words)


def clock(seconds: float) -> str:
    """A moment as ``12:03:10 UTC``."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(seconds))
