"""GPU samples from NVML: the only module that imports pynvml (STYLE rule 6).

pynvml is imported lazily, so ``import jobsight.agent.node.nvml`` works without nvidia-ml-py.
:class:`NvmlSampler` initialises NVML on first use under a lock, reads one
snapshot per GPU per :meth:`NvmlSampler.sample` call, turns a field the GPU or
driver cannot give into ``None`` (logged once per device and field), and shuts
NVML down at exit. A lost GPU is reported as ``lost=True`` and not asked again;
the other GPUs carry on (STYLE rule 7). The readings themselves, and the
``CUDA_VISIBLE_DEVICES`` parsing, are plain data in :mod:`jobsight.agent.node.gpu_reading`.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from jobsight.agent.node.gpu_reading import GpuReading, visible_gpu_indices

log = logging.getLogger("jobsight.agent.nvml")

T = TypeVar("T")

# pynvml constants, repeated here so they can be named before pynvml is imported.
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_CLOCK_MEM = 2
_PCIE_TX = 0
_PCIE_RX = 1
_ECC_UNCORRECTED = 1
_ECC_VOLATILE = 0
_GPM_SM_UTIL = 2
_GPM_ANY_TENSOR_UTIL = 5


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node; ``str()`` is one line fit for a user."""


class _GpuLost(Exception):
    pass


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str | None
    mig_uuid: str | None = None
    parent: _Device | None = None
    migs: list[_Device] = field(default_factory=list)
    lost: bool = False
    gpm_supported: bool | None = None
    gpm_previous: Any = None

    @property
    def key(self) -> str:
        return self.mig_uuid or self.uuid or f"gpu{self.index}"


def _import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed; install the agent extra: pip install 'jobsight[agent]'"
        ) from None


def _load_library(nv: Any, path: str) -> None:
    """Make pynvml call the library at ``path`` instead of the system one."""
    try:
        library = ctypes.CDLL(path)
    except OSError as exc:
        raise NvmlUnavailable(f"cannot load the NVML library {path}: {exc}") from None
    with nv.libLoadLock:
        current = nv.nvmlLib
        if current is not None and getattr(current, "_name", None) == path:
            return
        if current is not None and nv._nvmlLib_refcount > 0:
            raise NvmlUnavailable(
                f"NVML is already in use from {current._name} in this process; cannot switch to {path}"
            )
        nv.nvmlLib = library
        nv._nvmlGetFunctionPointer_cache.clear()


def _init_failure_message(nv: Any, exc: Exception) -> str:
    if isinstance(exc, nv.NVMLError_LibraryNotFound):
        return "the NVIDIA driver library libnvidia-ml.so.1 was not found; is the NVIDIA driver installed on this node?"
    if isinstance(exc, nv.NVMLError_DriverNotLoaded):
        return "the NVIDIA kernel driver is not loaded (nvmlInit: Driver Not Loaded); is there a GPU on this node?"
    if isinstance(exc, nv.NVMLError_NoPermission):
        return "no permission to use NVML (nvmlInit: Insufficient Permissions)"
    return f"NVML could not be initialised: {exc}"


def _free_gpm_sample(nv: Any, sample: Any) -> None:
    try:
        nv.nvmlGpmSampleFree(sample)
    except nv.NVMLError as exc:
        log.debug("nvmlGpmSampleFree failed: %s", exc)  # nothing more can be done with it


class NvmlSampler:
    """Reads every GPU on the node through NVML.

    ``library_path`` names a ``libnvidia-ml.so.1`` to use (tests pass the fake one);
    ``None`` lets pynvml load the system library. NVML is initialised on the first
    :meth:`open`, :meth:`sample` or :meth:`visible_gpu_indices` call, which raise
    :class:`NvmlUnavailable` when the library, driver or nvmlInit fails.
    """

    def __init__(self, library_path: str | None = None) -> None:
        self._library_path = library_path
        self._lock = threading.Lock()
        self._nv: Any = None
        self._gpus: list[_Device] = []
        self._logged: set[tuple[str, str]] = set()
        self._absent: set[tuple[str, str]] = set()
        self.driver_version: str | None = None

    # -- lifecycle ---------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML and find the GPUs, if not done yet."""
        with self._lock:
            self._open_locked()

    def close(self) -> None:
        """Shut NVML down; safe to call twice. A later :meth:`sample` opens it again."""
        with self._lock:
            nv, self._nv = self._nv, None
            if nv is None:
                return
            atexit.unregister(self.close)
            for gpu in self._gpus:
                self._free_gpm(nv, gpu)
            self._gpus = []
            try:
                nv.nvmlShutdown()
            except nv.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_locked(self) -> Any:
        if self._nv is not None:
            return self._nv
        nv = _import_pynvml()
        if self._library_path is not None:
            _load_library(nv, self._library_path)
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(_init_failure_message(nv, exc)) from None
        self._nv = nv
        atexit.register(self.close)
        self.driver_version = self._query("system", "driver_version", nv.nvmlSystemGetDriverVersion)
        self._gpus = self._find_gpus(nv)
        log.info("NVML: driver %s, %d GPU(s)", self.driver_version, len(self._gpus))
        return nv

    def _find_gpus(self, nv: Any) -> list[_Device]:
        count = self._query("system", "gpu_count", nv.nvmlDeviceGetCount) or 0
        gpus: list[_Device] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except nv.NVMLError_GpuIsLost:
                log.warning("GPU %d is lost (fell off the bus?); reporting it as lost", index)
                gpus.append(_Device(index, None, "", None, lost=True))
                continue
            except nv.NVMLError as exc:
                # NoPermission here usually means a cgroup hides the GPU from this job.
                log.info("GPU %d skipped: %s", index, exc)
                continue
            gpu = _Device(index, handle, "", None)
            try:
                gpu.uuid = self._query(gpu.key, "uuid", nv.nvmlDeviceGetUUID, handle) or ""
                gpu.name = self._query(gpu.key, "name", nv.nvmlDeviceGetName, handle)
                gpu.migs = self._find_migs(nv, gpu)
            except _GpuLost:
                self._mark_lost(nv, gpu)
            gpus.append(gpu)
        return gpus

    def _find_migs(self, nv: Any, gpu: _Device) -> list[_Device]:
        mode = self._query(gpu.key, "mig_mode", nv.nvmlDeviceGetMigMode, gpu.handle)
        if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = self._query(gpu.key, "mig_count", nv.nvmlDeviceGetMaxMigDeviceCount, gpu.handle) or 0
        migs: list[_Device] = []
        for slot in range(slots):
            try:
                handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
            except nv.NVMLError_NotFound:
                continue  # an empty slot: fewer instances than the GPU can hold
            except nv.NVMLError_GpuIsLost:
                raise _GpuLost() from None
            except nv.NVMLError as exc:
                log.info("GPU %d MIG slot %d skipped: %s", gpu.index, slot, exc)
                continue
            mig_uuid = self._query(gpu.key, "mig_uuid", nv.nvmlDeviceGetUUID, handle)
            if mig_uuid:
                migs.append(_Device(gpu.index, handle, gpu.uuid, gpu.name, mig_uuid, parent=gpu))
        return migs

    # -- queries -----------------------------------------------------------

    def _query(self, key: str, name: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call one NVML function; ``None`` when this device cannot give the value.

        NotSupported and FunctionNotFound are permanent, so the field is not asked
        again; other errors lose the field for this tick only. Both are logged
        once per device and field. A lost GPU raises :class:`_GpuLost`.
        """
        nv = self._nv
        if (key, name) in self._absent:
            return None
        try:
            return fn(*args)
        except nv.NVMLError_GpuIsLost:
            raise _GpuLost() from None
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound) as exc:
            # Expected on many GPUs (MIG devices, consumer cards, old drivers): debug only.
            self._absent.add((key, name))
            self._log_once(logging.DEBUG, key, name, exc)
        except nv.NVMLError as exc:
            self._log_once(logging.WARNING, key, name, exc)
        return None

    def _log_once(self, level: int, key: str, name: str, exc: Exception) -> None:
        if (key, name) not in self._logged:
            self._logged.add((key, name))
            log.log(level, "NVML %s unavailable on %s: %s", name, key, exc)

    def _clock_reasons(self, handle: Any) -> int:
        nv = self._nv
        try:
            return int(nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except nv.NVMLError_FunctionNotFound:  # drivers before 535
            return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def _processes(self, handle: Any) -> list[Any]:
        nv = self._nv
        # The unversioned pynvml wrapper turns FunctionNotFound into a non-NVMLError,
        # so the versioned calls are made directly: v3 (R510+), then v2.
        try:
            return list(nv.nvmlDeviceGetComputeRunningProcesses_v3(handle))
        except nv.NVMLError_FunctionNotFound:
            return list(nv.nvmlDeviceGetComputeRunningProcesses_v2(handle))

    def _gpm(self, gpu: _Device) -> tuple[float | None, float | None]:
        """SM and tensor activity between the previous tick's GPM sample and now."""
        nv = self._nv
        if gpu.gpm_supported is None:
            support = self._query(gpu.key, "gpm", nv.nvmlGpmQueryDeviceSupport, gpu.handle)
            gpu.gpm_supported = bool(support is not None and support.isSupportedDevice)
        if not gpu.gpm_supported:
            return None, None
        sample = self._query(gpu.key, "gpm", nv.nvmlGpmSampleAlloc)
        if sample is None:
            return None, None
        try:
            taken = self._query(gpu.key, "gpm", nv.nvmlGpmSampleGet, gpu.handle, sample)
        except _GpuLost:
            _free_gpm_sample(nv, sample)
            raise
        if taken is None:
            _free_gpm_sample(nv, sample)
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
            result = self._query(gpu.key, "gpm_metrics", nv.nvmlGpmMetricsGet, request)
        finally:
            _free_gpm_sample(nv, previous)
        if result is None:
            return None, None
        sm, tensor = result.metrics[0], result.metrics[1]
        # GPM percentages can overshoot 100 by rounding; the wire refuses what is not a percent.
        return (
            _percent(sm.value) if sm.nvmlReturn == 0 else None,
            _percent(tensor.value) if tensor.nvmlReturn == 0 else None,
        )

    def _free_gpm(self, nv: Any, gpu: _Device) -> None:
        if gpu.gpm_previous is not None:
            _free_gpm_sample(nv, gpu.gpm_previous)
            gpu.gpm_previous = None

    def _mark_lost(self, nv: Any, gpu: _Device) -> None:
        if not gpu.lost:
            log.warning(
                "GPU %d (%s) is lost (fell off the bus?); not asking it again",
                gpu.index,
                gpu.uuid,
            )
        gpu.lost = True
        self._free_gpm(nv, gpu)

    # -- readings ----------------------------------------------------------

    def _read(self, dev: _Device, gpm: bool) -> GpuReading:
        nv, h, key = self._nv, dev.handle, dev.key
        q = self._query
        r = GpuReading(dev.index, dev.uuid, dev.name, dev.mig_uuid)
        # Utilisation first: it is what moves the fake library's clock (tests/fake_nvml).
        util = q(key, "util", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            r.util_gpu, r.util_mem = float(util.gpu), float(util.memory)
        mem = q(key, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            r.mem_used, r.mem_total = int(mem.used), int(mem.total)
        power = q(key, "power", nv.nvmlDeviceGetPowerUsage, h)
        r.power_w = None if power is None else power / 1000.0
        energy = q(key, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
        r.energy_j = None if energy is None else energy / 1000.0
        temp = q(key, "temperature", nv.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        r.temp_c = None if temp is None else float(temp)
        r.sm_clock_mhz = q(key, "sm_clock", nv.nvmlDeviceGetClockInfo, h, _CLOCK_SM)
        r.mem_clock_mhz = q(key, "mem_clock", nv.nvmlDeviceGetClockInfo, h, _CLOCK_MEM)
        r.pcie_tx_kbs = q(key, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_TX)
        r.pcie_rx_kbs = q(key, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_RX)
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
        if gpm:
            r.sm_active, r.tensor_active = self._gpm(dev)
        return r

    def _read_gpu(self, gpu: _Device) -> list[GpuReading]:
        if not gpu.lost:
            try:
                readings = [self._read(gpu, gpm=True)]
                readings += [self._read(mig, gpm=False) for mig in gpu.migs]
                return readings
            except _GpuLost:
                self._mark_lost(self._nv, gpu)
        rows = [GpuReading(gpu.index, gpu.uuid, gpu.name, lost=True)]
        rows += [GpuReading(gpu.index, gpu.uuid, gpu.name, m.mig_uuid, lost=True) for m in gpu.migs]
        return rows

    def sample(self, gpu_indices: Collection[int] | None = None) -> list[GpuReading]:
        """One reading per GPU, plus one per MIG device on a GPU in MIG mode.

        ``gpu_indices`` limits it to those NVML indices (see :meth:`visible_gpu_indices`).
        """
        with self._lock:
            self._open_locked()
            readings: list[GpuReading] = []
            for gpu in self._gpus:
                if gpu_indices is None or gpu.index in gpu_indices:
                    readings += self._read_gpu(gpu)
            return readings

    def visible_gpu_indices(self, cuda_visible_devices: str | None) -> list[int]:
        """NVML indices of the GPUs a ``CUDA_VISIBLE_DEVICES`` value names."""
        with self._lock:
            self._open_locked()
            devices = [(g.index, g.uuid, [m.mig_uuid or "" for m in g.migs]) for g in self._gpus]
        return visible_gpu_indices(cuda_visible_devices, devices)


def _percent(value: float) -> float | None:
    """``value`` kept within 0..100; ``None`` for NaN."""
    number = float(value)
    return None if number != number else min(100.0, max(0.0, number))
