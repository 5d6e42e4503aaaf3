"""RAPL: the energy counters of the CPU packages and their DRAM, through the kernel's powercap files.

The kernel's ``intel_rapl`` driver (AMD's Zen packages use the same one and the same names) makes a
zone per package, ``<root>/intel-rapl:<n>`` named ``package-<n>``, with subzones
``<root>/intel-rapl:<n>:<m>`` named ``core``, ``uncore`` or ``dram``. Each has ``energy_uj``, a
counter of microjoules that wraps to 0 after ``max_energy_range_uj``. Packages and DRAM are summed;
``core`` and ``uncore`` are inside their package's figure, ``psys`` (the whole platform, on some
laptops and workstations) overlaps both, and ``intel-rapl-mmio`` zones repeat the packages through
another interface, so those are left out.

What RAPL does not see: fans, disks, network cards, the power supplies' losses, and the GPUs. A
site that wants those reads the BMC instead (IPMI or Redfish). ``energy_uj`` is root's only since
the PLATYPUS side channel (CVE-2020-8694); the node daemon runs as root.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass
from typing import Final

log = logging.getLogger("jobsight.agent.power")

_ZONE: Final = re.compile(r"^(?:intel|amd)-rapl:\d+(?::\d+)?$")
_COUNTED: Final = re.compile(r"^(?:package-\d+|dram)$")


@dataclass(frozen=True)
class RaplZone:
    path: str
    name: str
    range_uj: int
    """Where ``energy_uj`` wraps back to 0."""


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def find_zones(root: str = "/sys/class/powercap") -> list[RaplZone]:
    """The package and DRAM zones under ``root`` whose counter can be read, in path order."""
    zones = []
    for path in sorted(glob.glob(os.path.join(glob.escape(root), "*-rapl:*"))):
        if not _ZONE.match(os.path.basename(path)):
            continue
        try:
            with open(os.path.join(path, "name"), encoding="ascii") as handle:
                name = handle.read().strip()
        except OSError:
            continue
        range_uj = _read_int(os.path.join(path, "max_energy_range_uj"))
        if _COUNTED.match(name) and range_uj and _read_int(os.path.join(path, "energy_uj")) is not None:
            zones.append(RaplZone(path, name, range_uj))
    return zones


class RaplCounters:
    """The joules the node's packages and DRAM used between two calls of :meth:`energy_since_last`."""

    name: Final = "rapl"
    includes_gpus: Final = False

    def __init__(self, root: str = "/sys/class/powercap") -> None:
        self.root = root
        self.zones = find_zones(root)
        if not self.zones:
            log.warning("jobsight agent: no readable RAPL package zone under %s: node power off "
                        "(the daemon must run as root; is the intel_rapl driver loaded?)", root)
        self._previous: dict[str, int] = {}

    def energy_since_last(self, gpu_watts: float | None, now: float) -> float | None:
        """Joules since the previous call, the counters' wrap-arounds undone; ``None`` on the first call
        or when a zone could not be read (that interval has no node figure). ``gpu_watts`` and ``now``
        are unused: RAPL counts energy itself and never includes the GPUs."""
        del gpu_watts, now
        total_uj = 0
        complete = bool(self.zones)
        for zone in self.zones:
            value = _read_int(os.path.join(zone.path, "energy_uj"))
            before = self._previous.get(zone.path)
            if value is None:
                self._previous.pop(zone.path, None)
                complete = False
                continue
            self._previous[zone.path] = value
            if before is None:
                complete = False
                continue
            # One wrap at most between ticks: a 2^32 µJ range wraps after ~20 min at 3.5 kW.
            total_uj += value - before if value >= before else value + zone.range_uj - before
        return total_uj / 1e6 if complete else None

    def close(self) -> None:
        """Nothing runs in the background: the counters are read on the tick."""
