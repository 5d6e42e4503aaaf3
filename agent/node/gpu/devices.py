"""The GPUs NVML found on the node, with their MIG devices, and what is kept of each between ticks.

A GPU is found once, when NVML opens (:func:`find_gpus`), and kept until it closes; one that
falls off the bus is marked lost (:func:`mark_lost`) and not asked again, while the others carry
on (CONTRIBUTING rule 7).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from jobsight.agent.node.gpu.field_values import FieldRequest
from jobsight.agent.node.gpu.nvml import GpuLost, Nvml

log = logging.getLogger("jobsight.agent.nvml")


@dataclass
class Device:
    index: int
    handle: Any
    uuid: str
    name: str | None
    mig_uuid: str | None = None
    parent: Device | None = None
    migs: list[Device] = field(default_factory=list)
    lost: bool = False
    gpm_supported: bool | None = None
    gpm_previous: Any = None
    nvlinks: list[NvLink] | None = None
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
class NvLink:
    """One link, and the names its counters are remembered by in :attr:`Nvml.absent`, by counter
    id (``nvmlNvLinkErrorCounter_t``): made once, not every tick."""

    link: int
    names: tuple[str, ...]

    @classmethod
    def of(cls, link: int) -> NvLink:
        return cls(link, tuple(f"nvlink{link}_{c}" for c in ("replay", "recovery", "crc_flit", "crc_data")))


def find_gpus(door: Nvml, nv: Any) -> list[Device]:
    """Every GPU NVML lists, with its MIG devices; a GPU hidden from this process is left out, a
    lost one kept as lost."""
    count = door.query("system", "gpu_count", nv.nvmlDeviceGetCount) or 0
    gpus: list[Device] = []
    for index in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError_GpuIsLost:
            log.warning("GPU %d is lost (fell off the bus?); reporting it as lost", index)
            gpus.append(Device(index, None, "", None, lost=True))
            continue
        except nv.NVMLError as exc:
            # NoPermission here usually means a cgroup hides the GPU from this job.
            log.info("GPU %d skipped: %s", index, exc)
            continue
        gpu = Device(index, handle, "", None)
        try:
            gpu.uuid = door.query(gpu.key, "uuid", nv.nvmlDeviceGetUUID, handle) or ""
            gpu.name = door.query(gpu.key, "name", nv.nvmlDeviceGetName, handle)
            gpu.migs = _find_migs(door, nv, gpu)
        except GpuLost:
            mark_lost(nv, gpu)
        gpus.append(gpu)
    return gpus


def _find_migs(door: Nvml, nv: Any, gpu: Device) -> list[Device]:
    mode = door.query(gpu.key, "mig_mode", nv.nvmlDeviceGetMigMode, gpu.handle)
    if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
        return []
    slots = door.query(gpu.key, "mig_count", nv.nvmlDeviceGetMaxMigDeviceCount, gpu.handle) or 0
    migs: list[Device] = []
    for slot in range(slots):
        try:
            handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
        except nv.NVMLError_NotFound:
            continue  # an empty slot: fewer instances than the GPU can hold
        except nv.NVMLError_GpuIsLost:
            raise GpuLost() from None
        except nv.NVMLError as exc:
            log.info("GPU %d MIG slot %d skipped: %s", gpu.index, slot, exc)
            continue
        mig_uuid = door.query(gpu.key, "mig_uuid", nv.nvmlDeviceGetUUID, handle)
        if mig_uuid:
            migs.append(Device(gpu.index, handle, gpu.uuid, gpu.name, mig_uuid, parent=gpu))
    return migs


def mark_lost(nv: Any, gpu: Device) -> None:
    """The GPU fell off the bus: said once, and its GPM sample freed."""
    if not gpu.lost:
        log.warning(
            "GPU %d (%s) is lost (fell off the bus?); not asking it again",
            gpu.index,
            gpu.uuid,
        )
    gpu.lost = True
    free_gpm(nv, gpu)


def free_gpm(nv: Any, gpu: Device) -> None:
    """Free the GPU's kept GPM sample, if any."""
    if gpu.gpm_previous is not None:
        free_gpm_sample(nv, gpu.gpm_previous)
        gpu.gpm_previous = None


def free_gpm_sample(nv: Any, sample: Any) -> None:
    try:
        nv.nvmlGpmSampleFree(sample)
    except nv.NVMLError as exc:
        log.debug("nvmlGpmSampleFree failed: %s", exc)  # nothing more can be done with it
