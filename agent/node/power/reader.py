"""The node's power beside its GPUs': what a source read, and the background reader of the slow ones.

A site picks one source per node (``JOBSIGHT_POWER_SOURCE``):

* ``rapl``: the kernel's powercap energy counters of the CPU packages and their DRAM
  (:mod:`jobsight.agent.node.power.rapl`), read on the tick: a few small files;
* ``ipmi``: the BMC's DCMI power reading (or a power sensor) through ``ipmitool``
  (:mod:`jobsight.agent.node.power.ipmi`);
* ``redfish``: the BMC's Redfish ``Power`` resource over HTTPS (:mod:`jobsight.agent.node.power.redfish`);
* ``none``: the GPUs' energy alone.

A BMC answers in tens of milliseconds when it is well and not at all when it is not, so the BMC
sources are read by :class:`BackgroundPowerReader`, on their own thread and interval: the tick only
takes the latest watts, and a BMC that stops answering is said once, skipped and retried, never
waited for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

log = logging.getLogger("jobsight.agent.power")

SOURCES: Final = ("none", "rapl", "ipmi", "redfish")


class PowerReadError(Exception):
    """A power source could not be read. The message says why, and never holds a secret.
    ``refused``: the BMC refused the credentials (a wrong password, said once until it works)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class PowerReading:
    """The node's power as its source last read it: watts at a monotonic time."""

    watts: float
    at: float


class BackgroundPowerReader:
    """Calls ``fetch`` (blocking; returns watts or raises :class:`PowerReadError`) every
    ``interval_s`` on a daemon thread and keeps the latest reading.

    The first failure of an outage is logged once as a warning, its end once as info; between
    them the reader keeps trying at its interval. :meth:`latest` never blocks.
    """

    def __init__(self, name: str, fetch: Callable[[], float], interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._fetch = fetch
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: PowerReading | None = None
        self._failing = False
        self.failures = 0
        """Reads that failed since start (tests and the debug log)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"jobsight-power-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, wait_s: float = 1.0) -> None:
        """Stop reading; wait up to ``wait_s`` for a read in flight to end, so that nothing is said
        after the source was closed (a hung BMC's read is left to its own timeout)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait_s)

    def read_once(self) -> None:
        """One read, its outcome kept and said as :meth:`_run` would (the thread's body; tests call it)."""
        try:
            watts = float(self._fetch())
            if watts != watts or watts < 0:
                raise PowerReadError(f"it reported {watts!r} W")
        except PowerReadError as exc:
            self.failures += 1
            if not self._failing:
                log.warning("jobsight agent: node power from %s unavailable, skipped until it answers "
                            "(retrying every %.0f s): %s", self.name, self.interval_s, exc)
            self._failing = True
            return
        except Exception as exc:  # noqa: BLE001 - boundary: a source's bug must not end the reader
            self.failures += 1
            if not self._failing:
                log.warning("jobsight agent: node power from %s failed: %r", self.name, exc)
            self._failing = True
            return
        if self._failing:
            log.info("jobsight agent: node power from %s is back", self.name)
        self._failing = False
        with self._lock:
            self._latest = PowerReading(watts, self._clock())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval_s)

    def latest(self, max_age_s: float) -> PowerReading | None:
        """The latest reading when it is at most ``max_age_s`` old; ``None`` otherwise."""
        with self._lock:
            reading = self._latest
        if reading is None or self._clock() - reading.at > max_age_s:
            return None
        return reading
