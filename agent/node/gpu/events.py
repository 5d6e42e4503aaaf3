"""Critical Xid errors, as NVML reports them through an event set.

The node daemon's sampler (``events=True``) registers every GPU that can report Xid errors in one
event set when NVML opens, and drains it without waiting, once per tick. NVML queues events for a
set until they are taken, so a sampler that never takes them should not have one.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any, Final

from jobsight.agent.node.gpu.devices import Device, mark_lost
from jobsight.agent.node.gpu.nvml import GpuLost, Nvml
from jobsight.protocol.records import GpuEvent, Int64

log = logging.getLogger("jobsight.agent.nvml")

_EVENT_XID: Final = 0x8  # nvmlEventTypeXidCriticalError
_EVENTS_PER_CALL: Final = 256
"""At most this many events are taken per :meth:`XidEvents.take` call: a storm of Xids (an
application faulting in a loop) waits in NVML's queue for the next tick rather than stall this one."""
_CODE_MAX: Final = int(Int64.hi)
"""The largest code the wire's bigint takes."""


class XidEvents:
    """One NVML event set for the GPUs' Xid errors, open while NVML is; every method expects
    ``door.lock`` held."""

    def __init__(self, door: Nvml) -> None:
        self._door = door
        self._event_set: Any = None
        self._gpus: dict[int | None, Device] = {}
        """The GPUs registered in the event set, by their handle's address."""
        self._logged: set[tuple[str, int]] = set()

    @property
    def registered(self) -> bool:
        return self._event_set is not None

    def open(self, nv: Any, gpus: Sequence[Device]) -> None:
        """Register every GPU that can report Xid errors in one event set, at open: an Xid of the
        first tick is delivered too (NVML gives a set only what happens after it registered)."""
        door = self._door
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            permanent = isinstance(exc, (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound))
            door.log_once(logging.DEBUG if permanent else logging.WARNING, "system", "events", exc)
            return
        registered: dict[int | None, Device] = {}
        for gpu in gpus:
            if gpu.lost:
                continue
            try:
                types = door.query(gpu.key, "event_types", nv.nvmlDeviceGetSupportedEventTypes, gpu.handle)
                if types is None or not int(types) & _EVENT_XID:
                    continue
                if door.query(gpu.key, "xid_events", _register_xids, nv, gpu.handle, event_set):
                    registered[_address(gpu.handle)] = gpu
            except GpuLost:
                mark_lost(nv, gpu)
        if registered:
            self._event_set, self._gpus = event_set, registered
        else:
            _free_event_set(nv, event_set)

    def take(self, nv: Any) -> list[GpuEvent]:
        """The Xid errors since the last call, oldest first; never waits."""
        events: list[GpuEvent] = []
        for _ in range(_EVENTS_PER_CALL):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError_Timeout:
                break  # nothing (more) happened
            except nv.NVMLError as exc:
                self._door.log_once(logging.WARNING, "system", "events", exc)
                if isinstance(exc, (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound)):
                    self.close(nv)  # not tried again while NVML stays open
                break
            gpu = self._gpus.get(_address(data.device))
            code = int(data.eventData)
            if gpu is None or not int(data.eventType) & _EVENT_XID or code > _CODE_MAX:
                continue
            events.append(GpuEvent(gpu_index=gpu.index, gpu_uuid=gpu.uuid, event="xid", code=code))
            if (gpu.uuid, code) not in self._logged:  # a faulting application repeats its Xid
                self._logged.add((gpu.uuid, code))
                log.warning("GPU %d (%s) reported Xid %d", gpu.index, gpu.uuid, code)
        return events

    def close(self, nv: Any) -> None:
        if self._event_set is not None:
            _free_event_set(nv, self._event_set)
        self._event_set, self._gpus = None, {}


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
