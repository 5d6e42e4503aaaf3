"""CPU time of processes, from ``/proc/<pid>/stat``: for the benches that measure what other processes
(the collector, PostgreSQL, the dashboard, the browser) spend."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

TICK_S: Final = 1.0 / os.sysconf("SC_CLK_TCK")
PROC: Final = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """One process's CPU so far."""

    pid: int
    ppid: int
    cpu_s: float
    """Its own user and system time, threads included."""
    reaped_s: float
    """Its children's that it has reaped (``cutime`` + ``cstime``): work of processes already gone."""


def read(pid: int) -> ProcStat:
    """Process ``pid``'s CPU so far; ``OSError`` when it is gone."""
    # The command's name (field 2) may hold spaces and parentheses; the fields after its last ")" are fixed:
    # ppid is field 4, utime, stime, cutime and cstime fields 14-17.
    fields = (PROC / str(pid) / "stat").read_text(errors="replace").rsplit(")", 1)[1].split()
    return ProcStat(pid, int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S,
                    (int(fields[13]) + int(fields[14])) * TICK_S)


def every() -> dict[int, ProcStat]:
    """Every process alive now, by pid."""
    stats = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = read(int(entry.name))
            except OSError:  # gone between the listing and the read
                continue
    return stats
