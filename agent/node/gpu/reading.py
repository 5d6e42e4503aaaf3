"""What one GPU reads at one tick, and which GPUs ``CUDA_VISIBLE_DEVICES`` names.

Plain data and parsing, no NVML: :mod:`jobsight.agent.node.gpu.sampler` fills :class:`GpuReading` in, and
the attribution and the tests use both without a GPU or pynvml.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from jobsight.protocol.records import GpuSample

WIRE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(GpuSample))


@dataclass
class GpuReading(GpuSample):
    """One GPU (or one MIG device) at one tick: the wire fields of a ``gpu_sample``, declared
    (and documented) on :class:`jobsight.protocol.records.GpuSample`, plus what the node daemon
    keeps for itself. ``None`` means NVML could not give the value."""

    processes: list[tuple[int, int]] = field(default_factory=list)
    """``(pid, used device memory in bytes)``; memory is 0 when NVML cannot tell.
    Not a wire field: the node daemon uses it to attribute the GPU to a job."""

    def to_record(self) -> dict[str, Any]:
        """The wire fields of a ``gpu_sample`` record; the caller adds kind, job, ts, node."""
        return {name: getattr(self, name) for name in WIRE_FIELDS}


def visible_gpu_indices(
    cuda_visible_devices: str | None,
    devices: Sequence[tuple[int, str, Sequence[str]]],
) -> list[int]:
    """Map ``CUDA_VISIBLE_DEVICES`` to NVML indices.

    ``devices`` holds ``(nvml_index, gpu_uuid, mig_uuids)`` per GPU. Entries are
    indices, ``GPU-<uuid>`` or ``MIG-<uuid>`` (a unique prefix is enough, as for
    CUDA); a MIG entry maps to its parent GPU. As CUDA does, parsing stops at the
    first entry that names no device. ``None`` (unset) means every GPU. A bare
    index is taken as the NVML index, which is the CUDA ordinal only under
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (what Slurm's GPU binding assumes).
    """
    if cuda_visible_devices is None:
        return [index for index, _, _ in devices]
    chosen: list[int] = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        found: int | None = None
        if entry.isdigit():
            wanted = int(entry)
            found = wanted if any(index == wanted for index, _, _ in devices) else None
        elif entry.startswith(("GPU-", "MIG-")):
            matches = {
                index
                for index, uuid, migs in devices
                if (uuid and uuid.startswith(entry))
                or any(mig.startswith(entry) for mig in migs if mig)
                # The pre-R470 form MIG-GPU-<uuid>/<gi>/<ci> names the parent GPU.
                or (entry.startswith("MIG-GPU-") and uuid == entry[4:].split("/")[0])
            }
            found = matches.pop() if len(matches) == 1 else None
        if found is None:
            break
        if found not in chosen:
            chosen.append(found)
    return chosen
