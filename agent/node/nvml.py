"""GPU samples from NVML: the only module that imports pynvml (STYLE rule 6).

pynvml is imported lazily, so ``import jobsight.agent.node.nvml`` works without nvidia-ml-py.
:class:`NvmlSampler` initialises NVML on first use under a lock, reads one
snapshot per GPU per :meth:`NvmlSampler.sample` call, turns a field the GPU or
driver cannot give into ``None`` (logged once per device and field), and shuts
NVML down at exit. A lost GPU is reported as ``lost=True`` and not asked again;
the other GPUs carry on (STYLE rule 7). The readings themselves, and the
``CUDA_VISIBLE_DEVICES`` parsing, are plain data in :mod:`jobsight.agent.node.gpu_reading`.

Besides the utilisation, each physical GPU's reading carries what says why it is slow or
failing: its NVLink error counters (summed over its links), PCIe replays, and its memory's row
remapping and page retirement flags, all from one ``nvmlDeviceGetFieldValues`` call a tick
(:mod:`jobsight.agent.node.nvml_fields`). Most GPUs lack some of these (a PCIe card has no NVLink,
an H100 no page retirement, a V100 no row remapping): what a GPU or driver answers NotSupported or
FunctionNotFound for is remembered per GPU and field, and not read again. On a driver without
field values they are asked function by function (NVLink's link by link), each function a GPU
lacks asked once. Critical Xid errors come through an NVML event set (``events=True``, the node
daemon's) that :meth:`NvmlSampler.events` drains without waiting, once per tick.
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

from jobsight.agent.node import precision
from jobsight.agent.node.gpu_reading import GpuReading, visible_gpu_indices
from jobsight.agent.node.nvml_fields import FieldRequest
from jobsight.protocol.records import GpuEvent

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
_NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS of nvml.h 12.x; an H100 SXM has 18 links
_NVLINK_REPLAY = 0  # nvmlNvLinkErrorCounter_t
_NVLINK_RECOVERY = 1
_NVLINK_CRC_FLIT = 2
_NVLINK_CRC_DATA = 3
_NVLINK_COUNTERS = (_NVLINK_REPLAY, _NVLINK_RECOVERY, _NVLINK_CRC_FLIT, _NVLINK_CRC_DATA)
# Field ids of nvml.h (NVML_FI_DEV_*) that give a GPU's fault counters in one call.
_FI_NVLINK_CRC_FLIT = 38  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: every link's, added up
_FI_NVLINK_CRC_DATA = 45  # …CRC_DATA_ERROR_COUNT_TOTAL
_FI_NVLINK_REPLAY = 52  # …REPLAY_ERROR_COUNT_TOTAL
_FI_NVLINK_RECOVERY = 59  # …RECOVERY_ERROR_COUNT_TOTAL
_FI_PCIE_REPLAYS = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
_FI_REMAP_PENDING = 144  # NVML_FI_DEV_REMAPPED_PENDING
_FI_REMAP_FAILURE = 145  # NVML_FI_DEV_REMAPPED_FAILURE
_FI_RETIRED_PENDING = 31  # NVML_FI_DEV_RETIRED_PENDING
_FAULT_FIELDS: dict[int, str] = {
    _FI_NVLINK_CRC_FLIT: "nvlink_crc_flit_total", _FI_NVLINK_CRC_DATA: "nvlink_crc_data_total",
    _FI_NVLINK_REPLAY: "nvlink_replay_total", _FI_NVLINK_RECOVERY: "nvlink_recovery_total",
    _FI_PCIE_REPLAYS: "pcie_replays", _FI_REMAP_PENDING: "remap_pending", _FI_REMAP_FAILURE: "remap_failure",
    _FI_RETIRED_PENDING: "retired_pages_pending",
}
"""The fields asked, each with the name it is remembered (when the GPU lacks it) and logged by."""
_NVML_SUCCESS = 0
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_ERROR_GPU_IS_LOST = 15
_EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
_EVENTS_PER_CALL = 256
"""At most this many events are taken per :meth:`NvmlSampler.events` call: a storm of Xids (an
application faulting in a loop) waits in NVML's queue for the next tick rather than stall this one."""


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
    nvlinks: list[_NvLink] | None = None
    """The GPU's NVLinks; ``None`` until first asked (only where the fault counters are read
    function by function)."""
    faults: FieldRequest | None = None
    """The fault counters' request, made at the first tick."""
    faults_lacking: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    """The returns of a tick whose only failures were fields the GPU lacks, and those fields:
    the same returns next tick need no look at each field."""

    @property
    def key(self) -> str:
        return self.mig_uuid or self.uuid or f"gpu{self.index}"


@dataclass(frozen=True)
class _NvLink:
    """One link, and the names its counters are remembered by in ``_absent``, by counter id
    (``nvmlNvLinkErrorCounter_t``): made once, not every tick."""

    link: int
    names: tuple[str, ...]

    @classmethod
    def of(cls, link: int) -> _NvLink:
        return cls(link, tuple(f"nvlink{link}_{c}" for c in ("replay", "recovery", "crc_flit", "crc_data")))


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

    ``faults=False`` leaves out the fault counters (what the sampler read before them: the
    benchmark's baseline). ``events=True`` registers the GPUs for Xid errors at open, for
    :meth:`events`: for the node daemon, which ships them; NVML queues events for a set until
    they are taken, so a sampler that never takes them should not have one.
    """

    def __init__(self, library_path: str | None = None, *, faults: bool = True, events: bool = False) -> None:
        self._library_path = library_path
        self._faults = faults
        self._events = events
        self._lock = threading.Lock()
        self._nv: Any = None
        self._gpus: list[_Device] = []
        self._logged: set[tuple[str, str]] = set()
        self._absent: set[tuple[str, str]] = set()
        self._event_set: Any = None
        self._event_gpus: dict[int | None, _Device] = {}
        """The GPUs registered in the event set, by their handle's address."""
        self._xids_logged: set[tuple[str, int]] = set()
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
            self._close_events(nv)
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
        if self._events:
            self._open_events(nv)
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

    # -- faults ------------------------------------------------------------

    def _read_faults(self, gpu: _Device, r: GpuReading) -> None:
        """The physical GPU's fault counters and flags, into ``r``; ``None`` where it has none.
        One ``nvmlDeviceGetFieldValues`` call for them all, or, on a driver that cannot answer
        it, one function at a time."""
        if (gpu.key, "fault_fields") not in self._absent and self._read_fault_fields(gpu, r):
            return
        self._read_fault_functions(gpu, r)

    def _read_fault_fields(self, gpu: _Device, r: GpuReading) -> bool:
        """:meth:`_read_faults` in one call; ``False`` (remembered) when the driver lacks it or
        none of the fields."""
        nv, key, absent = self._nv, gpu.key, self._absent
        try:
            if gpu.faults is None:
                gpu.faults = FieldRequest.make(nv, tuple(_FAULT_FIELDS))
                if gpu.faults is None:  # a pynvml whose nvmlFieldValue_t is not nvml.h's
                    absent.add((key, "fault_fields"))
                    return False
            statuses, values = gpu.faults.send(gpu.handle)
        except nv.NVMLError_GpuIsLost:
            raise _GpuLost() from None
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound) as exc:
            absent.add((key, "fault_fields"))
            self._log_once(logging.DEBUG, key, "fault_fields", exc)
            return False
        except nv.NVMLError as exc:
            self._log_once(logging.WARNING, key, "fault_fields", exc)
            return True  # every counter unknown this tick
        got = dict(zip(gpu.faults.ids, values, strict=True))
        if any(statuses):
            usual = gpu.faults_lacking
            if usual is not None and usual[0] == statuses:
                for field_id in usual[1]:
                    del got[field_id]
            elif not self._fields_answered(gpu, gpu.faults.ids, statuses, got):
                absent.add((key, "fault_fields"))  # none of them this way: function by function
                return False
        r.nvlink_crc_errors = _added(got, (_FI_NVLINK_CRC_FLIT, _FI_NVLINK_CRC_DATA))
        r.nvlink_replay_errors = _added(got, (_FI_NVLINK_REPLAY,))
        r.nvlink_recovery_errors = _added(got, (_FI_NVLINK_RECOVERY,))
        r.pcie_replays = _added(got, (_FI_PCIE_REPLAYS,))
        r.remapped_rows_pending = _flag(got, _FI_REMAP_PENDING)
        r.remap_failure = _flag(got, _FI_REMAP_FAILURE)
        r.retired_pages_pending = _flag(got, _FI_RETIRED_PENDING)
        return True

    def _fields_answered(self, gpu: _Device, ids: tuple[int, ...], statuses: tuple[int, ...],
                         got: dict[int, int | None]) -> bool:
        """Take out of ``got`` the fields that failed (``None``: unknown this tick) or that the
        GPU lacks (removed, and remembered); whether any field is left to read this way."""
        nv, key, absent = self._nv, gpu.key, self._absent
        lacking: list[int] = []
        failed = False
        for field_id, status in zip(ids, statuses, strict=True):
            if status == _NVML_SUCCESS:
                continue
            name = _FAULT_FIELDS[field_id]
            if (key, name) in absent:
                pass
            elif status == _NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost()
            elif status in (_NVML_ERROR_NOT_SUPPORTED, _NVML_ERROR_FUNCTION_NOT_FOUND):
                absent.add((key, name))  # NVML answers the field every tick: it is just not read
                self._log_once(logging.DEBUG, key, name, nv.NVMLError(status))
            else:
                got[field_id] = None
                failed = True
                self._log_once(logging.WARNING, key, name, nv.NVMLError(status))
                continue
            del got[field_id]
            lacking.append(field_id)
        gpu.faults_lacking = None if failed else (statuses, tuple(lacking))
        return len(lacking) < len(statuses)

    def _read_fault_functions(self, gpu: _Device, r: GpuReading) -> None:
        """:meth:`_read_faults` function by function, and NVLink link by link."""
        nv, h, key, q = self._nv, gpu.handle, gpu.key, self._query
        replays = q(key, "pcie_replays", nv.nvmlDeviceGetPcieReplayCounter, h)
        r.pcie_replays = None if replays is None else int(replays)
        rows = q(key, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:  # (corrected, uncorrected, pending, failure)
            r.remapped_rows_pending, r.remap_failure = bool(rows[2]), bool(rows[3])
        pending = q(key, "retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        r.retired_pages_pending = None if pending is None else bool(pending)
        links = self._nvlinks(gpu)
        if links:
            totals = self._nvlink_link_totals(gpu, links)
            r.nvlink_crc_errors = _added(totals, (_NVLINK_CRC_FLIT, _NVLINK_CRC_DATA))
            r.nvlink_replay_errors = _added(totals, (_NVLINK_REPLAY,))
            r.nvlink_recovery_errors = _added(totals, (_NVLINK_RECOVERY,))

    def _nvlinks(self, gpu: _Device) -> list[_NvLink]:
        """The GPU's links (up or down), found at the first call: a GPU's links do not change while
        the driver stays loaded, and asking each link every tick would cost more than its counters."""
        if gpu.nvlinks is not None:
            return gpu.nvlinks
        nv = self._nv
        links: list[_NvLink] = []
        for link in range(_NVLINK_MAX_LINKS):
            try:
                nv.nvmlDeviceGetNvLinkState(gpu.handle, link)
            except nv.NVMLError_GpuIsLost:
                raise _GpuLost() from None
            except nv.NVMLError_InvalidArgument:
                break  # past the GPU's last link
            except nv.NVMLError_NotSupported:
                continue  # no NVLink (a PCIe card: every link says so, once), or not this link
            except nv.NVMLError_FunctionNotFound as exc:
                self._log_once(logging.DEBUG, gpu.key, "nvlink", exc)
                break
            except nv.NVMLError as exc:
                self._log_once(logging.WARNING, gpu.key, "nvlink", exc)
                return []  # looked for again next tick
            links.append(_NvLink.of(link))
        gpu.nvlinks = links
        return links

    def _nvlink_link_totals(self, gpu: _Device, links: list[_NvLink]) -> dict[int, int | None]:
        """Each error counter added up over the links, counter id -> total, asking a link and
        counter at a time (``nvmlDeviceGetNvLinkErrorCounter``). A total is ``None`` when one
        link could not be read this tick (a total missing a link would look like a counter
        reset); a counter a link lacks is left out of its total, one no link has is absent."""
        nv, h, key, absent, q = self._nv, gpu.handle, gpu.key, self._absent, self._query
        read = nv.nvmlDeviceGetNvLinkErrorCounter
        totals: dict[int, int | None] = {}
        for counter in _NVLINK_COUNTERS:
            total: int | None = 0
            found = False
            for link in links:
                name = link.names[counter]
                if (key, name) in absent:
                    continue
                value = q(key, name, read, h, link.link, counter)
                if value is None:
                    if (key, name) in absent:
                        continue  # this link lacks the counter: left out from now on
                    total, found = None, True
                    break
                total = (total or 0) + int(value)
                found = True
            if found:
                totals[counter] = total
        return totals

    # -- events ------------------------------------------------------------

    def events(self) -> list[GpuEvent]:
        """The critical Xid errors NVML reported since the last call (or since NVML was opened),
        oldest first; never waits (the node daemon calls it every tick, after :meth:`sample`).
        Empty without ``events=True``, while NVML is not open, and on GPUs or drivers without events."""
        with self._lock:
            nv = self._nv
            return self._take_events(nv) if nv is not None and self._event_set is not None else []

    def _open_events(self, nv: Any) -> None:
        """Register every GPU that can report Xid errors in one event set, at open: an Xid of the
        first tick is delivered too (NVML gives a set only what happens after it registered)."""
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            permanent = isinstance(exc, (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound))
            self._log_once(logging.DEBUG if permanent else logging.WARNING, "system", "events", exc)
            return
        gpus: dict[int | None, _Device] = {}
        for gpu in self._gpus:
            if gpu.lost:
                continue
            try:
                types = self._query(gpu.key, "event_types", nv.nvmlDeviceGetSupportedEventTypes, gpu.handle)
                if types is None or not int(types) & _EVENT_XID:
                    continue
                if self._query(gpu.key, "xid_events", _register_xids, nv, gpu.handle, event_set):
                    gpus[_address(gpu.handle)] = gpu
            except _GpuLost:
                self._mark_lost(nv, gpu)
        if gpus:
            self._event_set, self._event_gpus = event_set, gpus
        else:
            _free_event_set(nv, event_set)

    def _take_events(self, nv: Any) -> list[GpuEvent]:
        events: list[GpuEvent] = []
        for _ in range(_EVENTS_PER_CALL):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError_Timeout:
                break  # nothing (more) happened
            except nv.NVMLError as exc:
                self._log_once(logging.WARNING, "system", "events", exc)
                if isinstance(exc, (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound)):
                    self._close_events(nv)  # not tried again while NVML stays open
                break
            gpu = self._event_gpus.get(_address(data.device))
            code = int(data.eventData)
            if gpu is None or not int(data.eventType) & _EVENT_XID or code > _INT8_MAX:
                continue
            events.append(GpuEvent(gpu_index=gpu.index, gpu_uuid=gpu.uuid, event="xid", code=code))
            if (gpu.uuid, code) not in self._xids_logged:  # a faulting application repeats its Xid
                self._xids_logged.add((gpu.uuid, code))
                log.warning("GPU %d (%s) reported Xid %d", gpu.index, gpu.uuid, code)
        return events

    def _close_events(self, nv: Any) -> None:
        if self._event_set is not None:
            _free_event_set(nv, self._event_set)
        self._event_set, self._event_gpus = None, {}

    # -- readings ----------------------------------------------------------

    def _read(self, dev: _Device, physical: bool) -> GpuReading:
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
                self._read_faults(dev, r)
        return r

    def _read_gpu(self, gpu: _Device) -> list[GpuReading]:
        if not gpu.lost:
            try:
                readings = [self._read(gpu, physical=True)]
                readings += [self._read(mig, physical=False) for mig in gpu.migs]
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


_INT8_MAX = 2**63 - 1
def _flag(got: dict[int, int | None], field_id: int) -> bool | None:
    value = got.get(field_id)
    return None if value is None else bool(value)


def _added(totals: dict[int, int | None], counters: tuple[int, ...]) -> int | None:
    """The sum of ``counters``' totals: ``None`` when the GPU has none of them, one could not be
    read, or the sum is no counter (NVML's "not available", all bits set, or below zero): the
    wire's bigint would refuse the whole batch for it."""
    present = [totals[c] for c in counters if c in totals]
    if not present or any(v is None for v in present):
        return None
    total = sum(v for v in present if v is not None)
    return total if 0 <= total <= _INT8_MAX else None


def _address(handle: Any) -> int | None:
    """A device handle's address: how an event names its GPU."""
    return ctypes.cast(handle, ctypes.c_void_p).value


def _register_xids(nv: Any, handle: Any, event_set: Any) -> bool:
    nv.nvmlDeviceRegisterEvents(handle, _EVENT_XID, event_set)
    return True


def _free_event_set(nv: Any, event_set: Any) -> None:
    try:
        nv.nvmlEventSetFree(event_set)
    except nv.NVMLError as exc:
        log.debug("nvmlEventSetFree failed: %s", exc)  # nothing more can be done with it


def _percent(value: float) -> float | None:
    """``value`` kept within 0..100, to a tenth of a point; ``None`` for NaN."""
    number = float(value)
    return None if number != number else precision.gpm_percent(min(100.0, max(0.0, number)))
