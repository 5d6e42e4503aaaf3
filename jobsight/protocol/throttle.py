"""NVML's clock event (throttle) reasons: the bit mask a ``gpu_sample`` carries, as names.

``gpu_sample.throttle_reasons`` is the mask as NVML gave it (``nvmlDeviceGetCurrentClocksEventReasons``,
called ``…ThrottleReasons`` before driver 535), so that a bit this table does not know yet is
kept. Anything that says *why* a GPU runs slow reads it through here: the node daemon, the
collector's rules and pages, the simulated GPUs of the demo. Standard library only.

Not every reason is a slowdown of work: an idle GPU lowers its clocks (``gpu_idle``), and
applications clocks, sync boost and the display clock are settings, not faults.
:func:`slowdowns` keeps the reasons that hold back a GPU that has work (:attr:`Reason.slows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Reason:
    """One bit of the mask."""

    bit: int
    name: str
    """A stable identifier (evidence, JSON, filters)."""
    label: str
    """What a person reads."""
    slows: bool
    """Holds back a GPU that has work (not a setting, not idleness)."""


GPU_IDLE: Final = Reason(0x1, "gpu_idle", "GPU idle", False)
APPLICATIONS_CLOCKS: Final = Reason(0x2, "applications_clocks", "applications clocks setting", False)
SW_POWER_CAP: Final = Reason(0x4, "sw_power_cap", "power cap", True)
HW_SLOWDOWN: Final = Reason(0x8, "hw_slowdown", "hardware slowdown", True)
"""The hardware's own brake: thermal or power, or an external signal (the power supply)."""
SYNC_BOOST: Final = Reason(0x10, "sync_boost", "sync boost", False)
"""Clocks held to those of the GPUs it is synchronised with."""
SW_THERMAL_SLOWDOWN: Final = Reason(0x20, "sw_thermal_slowdown", "thermal slowdown (software)", True)
HW_THERMAL_SLOWDOWN: Final = Reason(0x40, "hw_thermal_slowdown", "thermal slowdown (hardware)", True)
HW_POWER_BRAKE: Final = Reason(0x80, "hw_power_brake", "power brake (hardware)", True)
DISPLAY_CLOCK: Final = Reason(0x100, "display_clock", "display clock setting", False)
BOARD_LIMIT: Final = Reason(0x200, "board_limit", "board limit", True)
RELIABILITY: Final = Reason(0x400, "reliability", "reliability limit", True)

REASONS: Final[tuple[Reason, ...]] = (
    GPU_IDLE, APPLICATIONS_CLOCKS, SW_POWER_CAP, HW_SLOWDOWN, SYNC_BOOST, SW_THERMAL_SLOWDOWN,
    HW_THERMAL_SLOWDOWN, HW_POWER_BRAKE, DISPLAY_CLOCK, BOARD_LIMIT, RELIABILITY,
)
"""Every reason NVML defines (nvml.h, ``nvmlClocksEventReason*``), lowest bit first."""

_BY_BIT: Final[dict[int, Reason]] = {r.bit: r for r in REASONS}
SLOWDOWN_MASK: Final = sum(r.bit for r in REASONS if r.slows)
"""The bits of :func:`slowdowns`."""


def _bits(mask: int) -> list[int]:
    """The set bits of a non-negative ``mask``, lowest first (a negative one, as an int8 column
    may hold it, is read as the unsigned 64-bit value it came from)."""
    mask &= (1 << 64) - 1
    return [1 << i for i in range(mask.bit_length()) if mask >> i & 1]


def reasons(mask: int | None) -> list[Reason]:
    """The reasons set in ``mask``, lowest bit first; a bit NVML had not defined when this was
    written becomes ``unknown_0x<bit>``. ``None`` (NVML could not tell) has none."""
    if mask is None:
        return []
    return [_BY_BIT.get(bit) or Reason(bit, f"unknown_{bit:#x}", f"unknown reason {bit:#x}", False)
            for bit in _bits(mask)]


def names(mask: int | None) -> list[str]:
    """:func:`reasons` by :attr:`Reason.name`."""
    return [r.name for r in reasons(mask)]


def labels(mask: int | None) -> list[str]:
    """:func:`reasons` by :attr:`Reason.label`."""
    return [r.label for r in reasons(mask)]


def slowdowns(mask: int | None) -> list[Reason]:
    """The reasons in ``mask`` that hold back a GPU with work (power, thermal, hardware brakes)."""
    return [r for r in reasons(mask) if r.slows]


@dataclass(frozen=True)
class Slowdown:
    """Reasons a finding names as one cause: NVML's software and hardware thermal bits are one
    "thermal slowdown" to a user."""

    name: str
    label: str
    mask: int
    measure: str | None
    """What to show beside it: ``temp_c`` or ``power_w`` while it held (``None``: nothing)."""


SLOWDOWNS: Final[tuple[Slowdown, ...]] = (
    Slowdown("thermal_slowdown", "thermal slowdown", SW_THERMAL_SLOWDOWN.bit | HW_THERMAL_SLOWDOWN.bit, "temp_c"),
    Slowdown("power_cap", "power cap", SW_POWER_CAP.bit, "power_w"),
    Slowdown("power_brake", "power brake (hardware)", HW_POWER_BRAKE.bit, "power_w"),
    Slowdown("hw_slowdown", "hardware slowdown", HW_SLOWDOWN.bit, "temp_c"),
    Slowdown("board_limit", "board limit", BOARD_LIMIT.bit, None),
    Slowdown("reliability", "reliability limit", RELIABILITY.bit, None),
)
"""Every slowing reason (:data:`SLOWDOWN_MASK`) in exactly one group."""
