"""What a profiling window covers: its step schedule, the profiler's options and the ranks
it runs on. Checked when a callback is made, so a bad value fails there (CONTRIBUTING rule 11)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

DEFAULT_TRACE_CAP_BYTES: Final = 4 * 1024 * 1024
"""Gzipped trace bytes kept at most; over it the profile carries its summary only."""


@dataclass(frozen=True)
class ProfileSchedule:
    """The torch profiler schedule, counted in training steps (see ``torch.profiler.schedule``).

    ``repeat=0`` repeats until training ends.
    """

    skip_first: int = 0
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1

    def __post_init__(self) -> None:
        for name in ("skip_first", "wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ValueError(f"profile schedule: {name} must be >= 0")
        if self.active < 1:
            raise ValueError("profile schedule: active must be >= 1")

    @property
    def total_steps(self) -> int | None:
        """Steps until the schedule is done; ``None`` for ``repeat=0`` (never)."""
        if self.repeat == 0:
            return None
        return self.skip_first + (self.wait + self.warmup + self.active) * self.repeat


@dataclass(frozen=True)
class ProfileOptions:
    record_shapes: bool = True
    profile_memory: bool = True
    with_flops: bool = True
    with_stack: bool = True
    """Record Python frames, so the summary names the user's line behind a repeated op (the
    python-loop hint needs it). The profiler runs only in a window, so outside it they cost nothing."""
    trace_cap_bytes: int = DEFAULT_TRACE_CAP_BYTES

    def __post_init__(self) -> None:
        if self.trace_cap_bytes < 0:
            raise ValueError("trace_cap_bytes must be >= 0 (0 keeps no trace)")


def as_schedule(profile: bool | ProfileSchedule | Mapping[str, int] | None) -> ProfileSchedule | None:
    """A callback's ``profile=`` argument as a schedule: ``True`` is the default one, falsy is off.

    Raises ``ValueError``/``TypeError`` for a bad value (callbacks call this in ``__init__``).
    """
    if profile is None or profile is False:
        return None
    if profile is True:
        return ProfileSchedule()
    if isinstance(profile, ProfileSchedule):
        return profile
    if isinstance(profile, Mapping):
        return ProfileSchedule(**profile)
    raise TypeError(f"profile must be a bool, a ProfileSchedule or a dict, not {type(profile).__name__}")


def check_ranks(ranks: Iterable[int] | None) -> tuple[int, ...] | None:
    """``None`` means every rank."""
    if ranks is None:
        return None
    checked = tuple(ranks)
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in checked):
        raise ValueError(f"ranks must be non-negative integers, got {checked!r}")
    return checked


def rank_chosen(rank: int | None, ranks: Sequence[int] | None) -> bool:
    return ranks is None or (rank or 0) in ranks
