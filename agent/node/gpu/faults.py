"""What says why a GPU is slow or failing: its fault counters and flags, read once a tick.

Each physical GPU's reading carries its NVLink error counters (summed over its links), PCIe
replays, and its memory's row remapping and page retirement flags, all from one
``nvmlDeviceGetFieldValues`` call a tick (:mod:`jobsight.agent.node.gpu.field_values`). Most GPUs
lack some of these (a PCIe card has no NVLink, an H100 no page retirement, a V100 no row
remapping): what a GPU or driver answers NotSupported or FunctionNotFound for is remembered per GPU
and field (:attr:`~jobsight.agent.node.gpu.nvml.Nvml.absent`), and not read again. On a driver
without field values they are asked function by function (NVLink's link by link), each function a
GPU lacks asked once.
"""

from __future__ import annotations

import logging
from typing import Final

from jobsight.agent.node.gpu.devices import Device, NvLink
from jobsight.agent.node.gpu.field_values import FieldRequest
from jobsight.agent.node.gpu.nvml import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    GpuLost,
    Nvml,
)
from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.protocol.records import Int64

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
_COUNTER_MAX: Final = int(Int64.hi)
"""The largest counter the wire's bigint takes."""


def read_faults(door: Nvml, gpu: Device, r: GpuReading) -> None:
    """The physical GPU's fault counters and flags, into ``r``; ``None`` where it has none.
    One ``nvmlDeviceGetFieldValues`` call for them all, or, on a driver that cannot answer
    it, one function at a time. The caller holds ``door.lock``."""
    if (gpu.key, "fault_fields") not in door.absent and _read_fault_fields(door, gpu, r):
        return
    _read_fault_functions(door, gpu, r)


def _read_fault_fields(door: Nvml, gpu: Device, r: GpuReading) -> bool:
    """:func:`read_faults` in one call; ``False`` (remembered) when the driver lacks it or
    none of the fields."""
    nv, key, absent = door.nv, gpu.key, door.absent
    try:
        if gpu.faults is None:
            gpu.faults = FieldRequest.make(nv, tuple(_FAULT_FIELDS))
            if gpu.faults is None:  # a pynvml whose nvmlFieldValue_t is not nvml.h's
                absent.add((key, "fault_fields"))
                return False
        statuses, values = gpu.faults.send(gpu.handle)
    except nv.NVMLError_GpuIsLost:
        raise GpuLost() from None
    except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound) as exc:
        absent.add((key, "fault_fields"))
        door.log_once(logging.DEBUG, key, "fault_fields", exc)
        return False
    except nv.NVMLError as exc:
        door.log_once(logging.WARNING, key, "fault_fields", exc)
        return True  # every counter unknown this tick
    got = dict(zip(gpu.faults.ids, values, strict=True))
    if any(statuses):
        usual = gpu.faults_lacking
        if usual is not None and usual[0] == statuses:
            for field_id in usual[1]:
                del got[field_id]
        elif not _fields_answered(door, gpu, gpu.faults.ids, statuses, got):
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


def _fields_answered(door: Nvml, gpu: Device, ids: tuple[int, ...], statuses: tuple[int, ...],
                     got: dict[int, int | None]) -> bool:
    """Take out of ``got`` the fields that failed (``None``: unknown this tick) or that the
    GPU lacks (removed, and remembered); whether any field is left to read this way."""
    nv, key, absent = door.nv, gpu.key, door.absent
    lacking: list[int] = []
    failed = False
    for field_id, status in zip(ids, statuses, strict=True):
        if status == NVML_SUCCESS:
            continue
        name = _FAULT_FIELDS[field_id]
        if (key, name) in absent:
            pass
        elif status == NVML_ERROR_GPU_IS_LOST:
            raise GpuLost()
        elif status in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
            absent.add((key, name))  # NVML answers the field every tick: it is just not read
            door.log_once(logging.DEBUG, key, name, nv.NVMLError(status))
        else:
            got[field_id] = None
            failed = True
            door.log_once(logging.WARNING, key, name, nv.NVMLError(status))
            continue
        del got[field_id]
        lacking.append(field_id)
    gpu.faults_lacking = None if failed else (statuses, tuple(lacking))
    return len(lacking) < len(statuses)


def _read_fault_functions(door: Nvml, gpu: Device, r: GpuReading) -> None:
    """:func:`read_faults` function by function, and NVLink link by link."""
    nv, h, key, q = door.nv, gpu.handle, gpu.key, door.query
    replays = q(key, "pcie_replays", nv.nvmlDeviceGetPcieReplayCounter, h)
    r.pcie_replays = None if replays is None else int(replays)
    rows = q(key, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
    if rows is not None:  # (corrected, uncorrected, pending, failure)
        r.remapped_rows_pending, r.remap_failure = bool(rows[2]), bool(rows[3])
    pending = q(key, "retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    r.retired_pages_pending = None if pending is None else bool(pending)
    links = _nvlinks(door, gpu)
    if links:
        totals = _nvlink_link_totals(door, gpu, links)
        r.nvlink_crc_errors = _added(totals, (_NVLINK_CRC_FLIT, _NVLINK_CRC_DATA))
        r.nvlink_replay_errors = _added(totals, (_NVLINK_REPLAY,))
        r.nvlink_recovery_errors = _added(totals, (_NVLINK_RECOVERY,))


def _nvlinks(door: Nvml, gpu: Device) -> list[NvLink]:
    """The GPU's links (up or down), found at the first call: a GPU's links do not change while
    the driver stays loaded, and asking each link every tick would cost more than its counters."""
    if gpu.nvlinks is not None:
        return gpu.nvlinks
    nv = door.nv
    links: list[NvLink] = []
    for link in range(_NVLINK_MAX_LINKS):
        try:
            nv.nvmlDeviceGetNvLinkState(gpu.handle, link)
        except nv.NVMLError_GpuIsLost:
            raise GpuLost() from None
        except nv.NVMLError_InvalidArgument:
            break  # past the GPU's last link
        except nv.NVMLError_NotSupported:
            continue  # no NVLink (a PCIe card: every link says so, once), or not this link
        except nv.NVMLError_FunctionNotFound as exc:
            door.log_once(logging.DEBUG, gpu.key, "nvlink", exc)
            break
        except nv.NVMLError as exc:
            door.log_once(logging.WARNING, gpu.key, "nvlink", exc)
            return []  # looked for again next tick
        links.append(NvLink.of(link))
    gpu.nvlinks = links
    return links


def _nvlink_link_totals(door: Nvml, gpu: Device, links: list[NvLink]) -> dict[int, int | None]:
    """Each error counter added up over the links, counter id -> total, asking a link and
    counter at a time (``nvmlDeviceGetNvLinkErrorCounter``). A total is ``None`` when one
    link could not be read this tick (a total missing a link would look like a counter
    reset); a counter a link lacks is left out of its total, one no link has is absent."""
    h, key, absent, q = gpu.handle, gpu.key, door.absent, door.query
    read = door.nv.nvmlDeviceGetNvLinkErrorCounter
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
    return total if 0 <= total <= _COUNTER_MAX else None
