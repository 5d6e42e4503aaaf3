"""Simulated GPUs: readings with :class:`~jobsight.agent.node.gpu.sampler.NvmlSampler`'s interface, no NVML.

``jobsight up --demo`` shows a multi-node GPU job on a laptop without a GPU. Its GPUs are these:
each one is told what the job asks of it (:meth:`SimulatedGpus.set_load`: how busy, how much
memory, which processes, whether it is thermally throttled) and reads back, at every
:meth:`SimulatedGpus.sample`, what NVML would report for that load: utilisation with a little
noise, power that follows the work, an energy counter that integrates that power over the time
between samples, a temperature that lags behind the power, SM clocks that drop when throttled,
and the clock event reason bits that say why. The readings are the same :class:`GpuReading`
rows NVML's sampler gives, so everything downstream (attribution, shipping, the collector, the
findings) handles them as it handles real ones.

The GPU's name says it is simulated, so a reading can never pass for a real GPU's.
Standard library only, like the rest of ``agent/node``.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Final, Self

from jobsight.agent.node.gpu import precision
from jobsight.agent.node.gpu.reading import GpuReading, visible_gpu_indices
from jobsight.protocol import throttle
from jobsight.protocol.records import GpuEvent

GiB: Final = 1024**3
NAME: Final = "H100 80GB HBM3 (simulated)"
MEMORY_TOTAL: Final = 80 * GiB
IDLE_W: Final = 70.0
TDP_W: Final = 700.0
SM_CLOCK_MHZ: Final = 1980
SM_CLOCK_THROTTLED_MHZ: Final = 1410
SM_CLOCK_IDLE_MHZ: Final = 345
MEM_CLOCK_MHZ: Final = 2619
AMBIENT_C: Final = 32.0
THERMAL_LAG_S: Final = 40.0
"""How fast the temperature follows the power: about two thirds of the way in this long."""

# NVML's clock event reason bits, as the real driver sets them.
REASON_GPU_IDLE: Final = throttle.GPU_IDLE.bit
REASON_SW_THERMAL: Final = throttle.SW_THERMAL_SLOWDOWN.bit
REASON_HW_THERMAL: Final = throttle.HW_THERMAL_SLOWDOWN.bit


def gpu_uuid(node: str, index: int) -> str:
    """The UUID of simulated GPU ``index`` of ``node``: the same on every run."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.simulated.jobsight"))


@dataclass(frozen=True)
class GpuLoad:
    """What the job asks of one GPU from now on."""

    util: float = 0.0
    """Percent of the time a kernel runs (NVML's ``util_gpu``)."""
    sm_active: float | None = None
    """Percent of the SMs busy (GPM); ``None`` means as busy as ``util`` says. A collective that
    spins waiting for a peer keeps a kernel running (high ``util``) on a few SMs (low here)."""
    mem_used: int = 0
    """Bytes of device memory the job's processes hold."""
    pids: tuple[int, ...] = ()
    """The compute processes on the GPU; they share ``mem_used``."""
    throttled: bool = False
    """Thermal slowdown: hotter, lower SM clock, the thermal reason bits set."""


@dataclass
class _Gpu:
    index: int
    uuid: str
    load: GpuLoad = field(default_factory=GpuLoad)
    energy_j: float = 0.0
    power_w: float = IDLE_W
    temp_c: float = AMBIENT_C
    last_s: float | None = None


class SimulatedGpus:
    """``count`` simulated GPUs of one node, read like :class:`~jobsight.agent.node.gpu.sampler.NvmlSampler`.

    ``clock`` gives the time of each reading in seconds (the demo passes its own, so that it
    can also write a run's past); ``seed`` makes the noise repeatable. The UUIDs follow from
    ``node`` and the index, so a node's GPUs keep theirs across runs.
    """

    def __init__(self, node: str, count: int = 8, *, clock: Callable[[], float] = time.time, seed: int = 0) -> None:
        self.node = node
        self.driver_version: str | None = "simulated"
        self._clock = clock
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._gpus = [_Gpu(i, gpu_uuid(node, i)) for i in range(count)]
        # A driver loaded some days ago: the energy counter does not start at zero.
        for gpu in self._gpus:
            gpu.energy_j = self._random.uniform(2e8, 6e8)

    # -- NvmlSampler's lifecycle: nothing to open or shut down -------------------------

    def open(self) -> None:
        """Nothing to initialise; here for the reader interface."""

    def close(self) -> None:
        """Nothing to shut down; here for the reader interface."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the job's side ---------------------------------------------------------------

    def set_load(self, index: int, load: GpuLoad) -> None:
        """From now on GPU ``index`` works as ``load`` says."""
        with self._lock:
            self._gpus[index].load = load

    # -- readings -----------------------------------------------------------------------

    def _noisy(self, value: float, spread: float) -> float:
        return min(100.0, max(0.0, value + self._random.gauss(0.0, spread)))

    def _read(self, gpu: _Gpu, now: float) -> GpuReading:
        load = gpu.load
        busy = load.util > 1.0
        util = self._noisy(load.util, 2.5) if busy else self._noisy(load.util, 0.3)
        sm = self._noisy(load.sm_active if load.sm_active is not None else util * 0.9, 2.0) if busy else 0.0
        # Power follows the SMs at work, not the time a kernel is resident: a spinning collective
        # keeps util high at a fraction of the power.
        power = IDLE_W + (TDP_W - IDLE_W) * sm / 100.0 * (0.8 if load.throttled else 1.0)
        power = max(IDLE_W * 0.9, power + self._random.gauss(0.0, 6.0))
        elapsed = 0.0 if gpu.last_s is None else max(0.0, now - gpu.last_s)
        gpu.energy_j += elapsed * (power + gpu.power_w) / 2.0  # the counter integrates power, as NVML's does
        target = AMBIENT_C + 48.0 * power / TDP_W + (22.0 if load.throttled else 0.0)
        gpu.temp_c += (target - gpu.temp_c) * (1.0 if gpu.last_s is None else min(1.0, elapsed / THERMAL_LAG_S))
        gpu.power_w, gpu.last_s = power, now
        if load.throttled:
            sm_clock, reasons = SM_CLOCK_THROTTLED_MHZ, REASON_SW_THERMAL | REASON_HW_THERMAL
        elif busy:
            sm_clock, reasons = SM_CLOCK_MHZ, 0
        else:
            sm_clock, reasons = SM_CLOCK_IDLE_MHZ, REASON_GPU_IDLE
        share = load.mem_used // len(load.pids) if load.pids else 0
        reading = GpuReading(gpu.index, gpu.uuid, NAME)
        reading.util_gpu = round(util, 1)
        reading.util_mem = round(util * 0.45, 1) if busy else 0.0
        reading.mem_used, reading.mem_total = load.mem_used + 512 * 1024**2, MEMORY_TOTAL  # the driver's own share
        reading.power_w = round(power, 1)
        reading.energy_j = float(round(gpu.energy_j))  # as the daemon sends NVML's (precision.py)
        reading.temp_c = float(round(gpu.temp_c))
        reading.sm_clock_mhz, reading.mem_clock_mhz = sm_clock, MEM_CLOCK_MHZ
        reading.pcie_tx_kbs = precision.pcie_kbs(int(sm * 180)) if busy else 0
        reading.pcie_rx_kbs = precision.pcie_kbs(int(sm * 240)) if busy else 0
        reading.throttle_reasons = reasons
        reading.ecc_errors = 0
        reading.processes = [(pid, share) for pid in load.pids]
        reading.process_count = len(load.pids)
        reading.sm_active = round(sm, 1)
        reading.tensor_active = round(sm * 0.7, 1)
        return reading

    def sample(self, gpu_indices: Collection[int] | None = None) -> list[GpuReading]:
        """One reading per GPU, at the clock's time now; ``gpu_indices`` limits it to those."""
        with self._lock:
            now = self._clock()
            return [self._read(g, now) for g in self._gpus if gpu_indices is None or g.index in gpu_indices]

    def events(self) -> list[GpuEvent]:
        """Simulated GPUs report no Xid errors; here for the reader interface."""
        return []

    def visible_gpu_indices(self, cuda_visible_devices: str | None) -> list[int]:
        """Indices of the GPUs a ``CUDA_VISIBLE_DEVICES`` value names, as NVML's sampler maps them."""
        return visible_gpu_indices(cuda_visible_devices, [(g.index, g.uuid, []) for g in self._gpus])
