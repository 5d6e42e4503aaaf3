"""GPU samples from NVML: what is read through the door (:mod:`jobsight.agent.node.gpu.nvml`).

:class:`NvmlSampler` opens NVML on first use, reads one snapshot per GPU per
:meth:`NvmlSampler.sample` call, and shuts NVML down at exit; a field the GPU or driver cannot
give is ``None`` (the door logs it once per device and field). A lost GPU is reported as
``lost=True`` and not asked again; the other GPUs carry on (CONTRIBUTING rule 7). The readings
themselves, and the ``CUDA_VISIBLE_DEVICES`` parsing, are plain data in
:mod:`jobsight.agent.node.gpu.reading`.

Besides the utilisation, each physical GPU's reading carries its fault counters
(:mod:`jobsight.agent.node.gpu.faults`). Critical Xid errors come through an NVML event set
(``events=True``, the node daemon's) that :meth:`NvmlSampler.events` drains without waiting, once
per tick (:mod:`jobsight.agent.node.gpu.events`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any, Final, Self

from jobsight.agent.node.gpu import precision
from jobsight.agent.node.gpu.devices import Device, find_gpus, free_gpm, free_gpm_sample, mark_lost
from jobsight.agent.node.gpu.events import XidEvents
from jobsight.agent.node.gpu.faults import read_faults
from jobsight.agent.node.gpu.nvml import GpuLost, Nvml
from jobsight.agent.node.gpu.reading import GpuReading, visible_gpu_indices
from jobsight.protocol.records import GpuEvent

log = logging.getLogger("jobsight.agent.nvml")

# pynvml constants, repeated here so they can be named before pynvml is imported.
_TEMPERATURE_GPU: Final = 0
_CLOCK_SM: Final = 1
_CLOCK_MEM: Final = 2
_PCIE_TX: Final = 0
_PCIE_RX: Final = 1
_ECC_UNCORRECTED: Final = 1
_ECC_VOLATILE: Final = 0
_GPM_SM_UTIL: Final = 2
_GPM_ANY_TENSOR_UTIL: Final = 5


class NvmlSampler:
    """Reads every GPU on the node through NVML.

    ``library_path`` names a ``libnvidia-ml.so.1`` to use (tests pass the fake one);
    ``None`` lets pynvml load the system library. NVML is initialised on the first
    :meth:`open`, :meth:`sample` or :meth:`visible_gpu_indices` call, which raise
    :class:`~jobsight.agent.node.gpu.nvml.NvmlUnavailable` when the library, driver or nvmlInit fails.

    ``faults=False`` leaves out the fault counters (what the sampler read before them: the
    benchmark's baseline). ``events=True`` registers the GPUs for Xid errors at open, for
    :meth:`events`: for the node daemon, which ships them; NVML queues events for a set until
    they are taken, so a sampler that never takes them should not have one.
    """

    def __init__(self, library_path: str | None = None, *, faults: bool = True, events: bool = False) -> None:
        self._door = Nvml(library_path, release=self._release)
        self._faults = faults
        self._events = events
        self._gpus: list[Device] = []
        self._xids = XidEvents(self._door)
        self.driver_version: str | None = None

    # -- lifecycle ---------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML and find the GPUs, if not done yet."""
        with self._door.lock:
            self._open_locked()

    def close(self) -> None:
        """Shut NVML down; safe to call twice. A later :meth:`sample` opens it again."""
        self._door.close()

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_locked(self) -> Any:
        nv, opened = self._door.open_locked()
        if not opened:
            return nv
        self.driver_version = self._door.query("system", "driver_version", nv.nvmlSystemGetDriverVersion)
        self._gpus = find_gpus(self._door, nv)
        if self._events:
            self._xids.open(nv, self._gpus)
        log.info("NVML: driver %s, %d GPU(s)", self.driver_version, len(self._gpus))
        return nv

    def _release(self, nv: Any) -> None:
        """What this sampler holds of NVML, freed before the door shuts it down."""
        self._xids.close(nv)
        for gpu in self._gpus:
            free_gpm(nv, gpu)
        self._gpus = []

    # -- events ------------------------------------------------------------

    def events(self) -> list[GpuEvent]:
        """The critical Xid errors NVML reported since the last call (or since NVML was opened),
        oldest first; never waits (the node daemon calls it every tick, after :meth:`sample`).
        Empty without ``events=True``, while NVML is not open, and on GPUs or drivers without events."""
        with self._door.lock:
            nv = self._door.nv
            return self._xids.take(nv) if nv is not None and self._xids.registered else []

    # -- readings ----------------------------------------------------------

    def _read(self, dev: Device, physical: bool) -> GpuReading:
        nv, h, key = self._door.nv, dev.handle, dev.key
        q = self._door.query
        r = GpuReading(dev.index, dev.uuid, dev.name, dev.mig_uuid)
        # Utilisation first: it is what moves the fake library's clock (tests/fake_nvml).
        util = q(key, "util", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            r.util_gpu, r.util_mem = float(util.gpu), float(util.memory)
        mem = q(key, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            r.mem_used, r.mem_total = int(mem.used), int(mem.total)
        power = q(key, "power", nv.nvmlDeviceGetPowerUsage, h)
        r.power_w = None if power is None else precision.watts(power)
        energy = q(key, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
        r.energy_j = None if energy is None else precision.joules(energy)
        temp = q(key, "temperature", nv.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        r.temp_c = None if temp is None else float(temp)
        r.sm_clock_mhz = q(key, "sm_clock", nv.nvmlDeviceGetClockInfo, h, _CLOCK_SM)
        r.mem_clock_mhz = q(key, "mem_clock", nv.nvmlDeviceGetClockInfo, h, _CLOCK_MEM)
        tx = q(key, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_TX)
        rx = q(key, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_RX)
        r.pcie_tx_kbs = None if tx is None else precision.pcie_kbs(tx)
        r.pcie_rx_kbs = None if rx is None else precision.pcie_kbs(rx)
        r.throttle_reasons = q(key, "throttle_reasons", self._clock_reasons, h)
        r.ecc_errors = q(
            key,
            "ecc",
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            _ECC_UNCORRECTED,
            _ECC_VOLATILE,
        )
        procs = q(key, "processes", self._processes, h)
        if procs is not None:
            r.processes = [(int(p.pid), int(p.usedGpuMemory or 0)) for p in procs]
            r.process_count = len(r.processes)
        if physical:
            r.sm_active, r.tensor_active = self._gpm(dev)
            if self._faults:
                read_faults(self._door, dev, r)
        return r

    def _read_gpu(self, gpu: Device) -> list[GpuReading]:
        if not gpu.lost:
            try:
                readings = [self._read(gpu, physical=True)]
                readings += [self._read(mig, physical=False) for mig in gpu.migs]
                return readings
            except GpuLost:
                mark_lost(self._door.nv, gpu)
        rows = [GpuReading(gpu.index, gpu.uuid, gpu.name, lost=True)]
        rows += [GpuReading(gpu.index, gpu.uuid, gpu.name, m.mig_uuid, lost=True) for m in gpu.migs]
        return rows

    def sample(self, gpu_indices: Collection[int] | None = None) -> list[GpuReading]:
        """One reading per GPU, plus one per MIG device on a GPU in MIG mode.

        ``gpu_indices`` limits it to those NVML indices (see :meth:`visible_gpu_indices`).
        """
        with self._door.lock:
            self._open_locked()
            readings: list[GpuReading] = []
            for gpu in self._gpus:
                if gpu_indices is None or gpu.index in gpu_indices:
                    readings += self._read_gpu(gpu)
            return readings

    def visible_gpu_indices(self, cuda_visible_devices: str | None) -> list[int]:
        """NVML indices of the GPUs a ``CUDA_VISIBLE_DEVICES`` value names."""
        with self._door.lock:
            self._open_locked()
            devices = [(g.index, g.uuid, [m.mig_uuid or "" for m in g.migs]) for g in self._gpus]
        return visible_gpu_indices(cuda_visible_devices, devices)

    def _clock_reasons(self, handle: Any) -> int:
        nv = self._door.nv
        try:
            return int(nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except nv.NVMLError_FunctionNotFound:  # drivers before 535
            return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def _processes(self, handle: Any) -> list[Any]:
        nv = self._door.nv
        # The unversioned pynvml wrapper turns FunctionNotFound into a non-NVMLError,
        # so the versioned calls are made directly: v3 (R510+), then v2.
        try:
            return list(nv.nvmlDeviceGetComputeRunningProcesses_v3(handle))
        except nv.NVMLError_FunctionNotFound:
            return list(nv.nvmlDeviceGetComputeRunningProcesses_v2(handle))

    def _gpm(self, gpu: Device) -> tuple[float | None, float | None]:
        """SM and tensor activity between the previous tick's GPM sample and now."""
        nv, q = self._door.nv, self._door.query
        if gpu.gpm_supported is None:
            support = q(gpu.key, "gpm", nv.nvmlGpmQueryDeviceSupport, gpu.handle)
            gpu.gpm_supported = bool(support is not None and support.isSupportedDevice)
        if not gpu.gpm_supported:
            return None, None
        sample = q(gpu.key, "gpm", nv.nvmlGpmSampleAlloc)
        if sample is None:
            return None, None
        try:
            taken = q(gpu.key, "gpm", nv.nvmlGpmSampleGet, gpu.handle, sample)
        except GpuLost:
            free_gpm_sample(nv, sample)
            raise
        if taken is None:
            free_gpm_sample(nv, sample)
            return None, None
        previous, gpu.gpm_previous = gpu.gpm_previous, sample
        if previous is None:
            return None, None  # the first tick has no interval to measure
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1 = previous
        request.sample2 = sample
        request.metrics[0].metricId = _GPM_SM_UTIL
        request.metrics[1].metricId = _GPM_ANY_TENSOR_UTIL
        try:
            result = q(gpu.key, "gpm_metrics", nv.nvmlGpmMetricsGet, request)
        finally:
            free_gpm_sample(nv, previous)
        if result is None:
            return None, None
        sm, tensor = result.metrics[0], result.metrics[1]
        # GPM percentages can overshoot 100 by rounding; the wire refuses what is not a percent.
        return (
            _percent(sm.value) if sm.nvmlReturn == 0 else None,
            _percent(tensor.value) if tensor.nvmlReturn == 0 else None,
        )


def _percent(value: float) -> float | None:
    """``value`` kept within 0..100, to a tenth of a point; ``None`` for NaN."""
    number = float(value)
    return None if number != number else precision.gpm_percent(min(100.0, max(0.0, number)))
