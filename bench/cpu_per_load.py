"""CPU time a page load costs each process on the machine, for bench/browser_page.py's ``--cpu``.

On a busy two-core machine a page's time is set less by what it waits for than by how much CPU every
process spends on it (the browser's renderer, its GPU process, the page's server, PostgreSQL): both
cores are busy most of a load, so a load takes about as long as its CPU time over the cores. The
times of a load then move with whatever else the machine does; the CPU a load costs each process
says which of them a change to the page moved, and by how much.

Read from ``/proc`` (:mod:`bench.proc_stat`: user and system time of every process, threads included) before
and after each timed load. What each group spends when no page loads (the live feed's ingest, the
servers' timers) is measured first and taken off in proportion to the load's time, so that a
longer load is not charged the background it happened to overlap.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from bench import proc_stat

T = TypeVar("T")
CHROMIUM_TYPES: Final = {"renderer": "renderer", "gpu-process": "GPU process"}
"""Chromium's ``--type`` of a child process and the name it is reported under; ``browser`` is the
process without one (Chromium's own), every other type is ``browser (other)``."""
GROUPS: Final = ("renderer", "GPU process", "browser", "browser (other)", "chromedriver", "page servers",
                 "PostgreSQL", "collector")
"""The groups in the order they are printed."""


def _group(pid: int, argv: list[str], named: Mapping[int, str]) -> str | None:
    """The group a process's CPU is counted in; ``None``: not counted (the bench itself and the rest)."""
    if pid in named:
        return named[pid]
    program = Path(argv[0]).name if argv else ""
    if program == "chromedriver":
        return "chromedriver"
    if program in ("chromium", "chrome", "chrome-headless-shell"):
        kind = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--type=")), None)
        return "browser" if kind is None else CHROMIUM_TYPES.get(kind, "browser (other)")
    if program.rstrip(":") == "postgres":  # the server's path, or a backend's title ("postgres: …")
        return "PostgreSQL"
    return None


def snapshot(named: Mapping[int, str]) -> defaultdict[str, float]:
    """CPU seconds so far of each group's processes (those alive now), by group; ``named``: a group for
    given pids (the servers the bench started)."""
    spent: defaultdict[str, float] = defaultdict(float)
    for pid, stat in proc_stat.every().items():
        try:
            argv = (proc_stat.PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone since
            continue
        words = [arg for arg in argv if arg]
        if len(words) == 1 and " " in words[0]:  # a title set over the arguments: Chromium's children, PostgreSQL's
            words = words[0].split()
        if (group := _group(pid, words, named)) is not None:
            spent[group] += stat.cpu_s
    return spent


@dataclass
class CpuMeter:
    """CPU per load by group, less the groups' background rate (:meth:`calibrate`)."""

    named: Mapping[int, str]
    background: dict[str, float] = field(default_factory=dict)
    """CPU seconds a second each group spends with no page loading."""
    loads: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    """Each page's loads, the CPU seconds of each group."""

    def calibrate(self, seconds: float = 10.0) -> None:
        """The background rate of each group, over ``seconds`` with no page loading."""
        before, began = snapshot(self.named), time.monotonic()
        time.sleep(seconds)
        after, elapsed = snapshot(self.named), time.monotonic() - began
        self.background = {group: max(0.0, (after[group] - before[group]) / elapsed) for group in after}

    def measure(self, page: str, load: Callable[..., T], *args: Any) -> T:
        """``load(*args)``, its CPU by group kept for ``page``."""
        before, began = snapshot(self.named), time.monotonic()
        result = load(*args)
        after, elapsed = snapshot(self.named), time.monotonic() - began
        self.loads.setdefault(page, []).append({
            group: after[group] - before[group] - self.background.get(group, 0.0) * elapsed
            for group in set(after) | set(before)})
        return result

    def mean_ms(self, page: str) -> dict[str, float]:
        """Mean CPU milliseconds a load of ``page``, by group (:data:`GROUPS` order) and in all; empty when
        none was measured."""
        loads = self.loads.get(page, [])
        if not loads:
            return {}
        means = {group: 1000 * statistics.fmean(load.get(group, 0.0) for load in loads) for group in GROUPS}
        return {**means, "all": sum(means.values())}

    def report(self, page: str, floor: str | None) -> str:
        """One line: ``page``'s mean CPU a load by group, and in all against ``floor``'s."""
        mine = self.mean_ms(page)
        if not mine:
            return f"{page:>8} CPU a load: no loads measured"
        parts = ", ".join(f"{group} {ms:.0f}" for group, ms in mine.items() if group != "all" and abs(ms) >= 0.5)
        ratio = ""
        if floor is not None and floor != page and (base := self.mean_ms(floor).get("all")):
            ratio = f"; {mine['all'] / base:4.2f}× the three-chart page's"
        return f"{page:>8} CPU a load (ms, mean of {len(self.loads[page])}): {parts}; all {mine['all']:.0f}{ratio}"
