"""Many NVML counters of one GPU in one call: ``nvmlDeviceGetFieldValues``, made cheap enough for
every tick.

The node daemon reads each GPU's fault counters every tick (NVLink errors, PCIe replays, row
remapping, page retirement). Asked one function at a time they are 3 calls and, for NVLink, 4
per link: 75 calls for an H100's 18 links. ``nvmlDeviceGetFieldValues`` answers all of them in one
call, but pynvml's wrapper builds a new array, fills it field by field and gives back structures
to read one attribute at a time, which costs more in Python than the call itself. So a
:class:`FieldRequest` is made once per GPU: the array NVML fills, with its field ids set, and a
``struct`` that reads every answer back in one go. Sending it again is one C call and one unpack.

The array's layout is nvml.h's ``nvmlFieldValue_t``, as pynvml declares it
(``c_nvmlFieldValue_t``): :meth:`FieldRequest.make` checks it and gives no request when a pynvml
declares another. No import of pynvml here: :mod:`jobsight.agent.node.gpu.nvml` (the only module that
imports it) passes the module in.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any, Final

# nvmlFieldValue_t: fieldId u32 @0, scopeId u32 @4, timestamp i64 @8, latencyUsec i64 @16,
# valueType enum @24, nvmlReturn enum @28, value (nvmlValue_t, an 8-byte union) @32; 40 bytes.
_LAYOUT: Final = (24, 28, 32, 40)
_ELEMENT: Final = "24x2iQ"
"""valueType, nvmlReturn and the value's 8 bytes (as an unsigned integer) of one element."""

# nvmlValueType_t
_DOUBLE, _UINT, _ULONG, _ULL, _SLL, _SINT, _USHORT = range(7)


def decode(value_type: int, raw: int) -> int | None:
    """The value of a field from the 8 bytes of its ``nvmlValue_t`` (read as an unsigned
    integer) and its ``nvmlValueType_t``: only the member NVML wrote counts (a 4-byte member
    leaves the other 4 as they were). ``None`` for a double that is not a finite number."""
    if value_type in (_ULL, _ULONG):  # an unsigned long is 8 bytes on Linux
        return raw
    if value_type == _UINT:
        return raw & 0xFFFF_FFFF
    if value_type == _SLL:
        return raw - (1 << 64) if raw >> 63 else raw
    if value_type == _SINT:
        low = raw & 0xFFFF_FFFF
        return low - (1 << 32) if low >> 31 else low
    if value_type == _USHORT:
        return raw & 0xFFFF
    if value_type == _DOUBLE:
        number: float = struct.unpack("<d", raw.to_bytes(8, "little"))[0]
        return int(number) if number - number == 0 else None  # finite
    return raw


class FieldRequest:
    """The fields ``field_ids`` of a GPU, asked with one ``nvmlDeviceGetFieldValues`` call."""

    def __init__(self, nv: Any, function: Any, field_ids: Sequence[int]) -> None:
        self._nv = nv
        self._function = function
        self.ids = tuple(field_ids)
        self._count = ctypes.c_int(len(self.ids))
        self._values = (nv.c_nvmlFieldValue_t * len(self.ids))()
        for slot, field_id in zip(self._values, self.ids, strict=True):
            slot.fieldId = field_id  # scopeId 0: the GPU's totals
        self._answers = struct.Struct("<" + _ELEMENT * len(self.ids))

    @classmethod
    def make(cls, nv: Any, field_ids: Sequence[int]) -> FieldRequest | None:
        """A request, or ``None`` when pynvml's ``c_nvmlFieldValue_t`` is not the layout read
        here. Raises pynvml's ``NVMLError_FunctionNotFound`` when the driver lacks the function."""
        declared = nv.c_nvmlFieldValue_t
        layout = (declared.valueType.offset, declared.nvmlReturn.offset, declared.value.offset,
                  ctypes.sizeof(declared))
        if layout != _LAYOUT:
            return None
        return cls(nv, nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues"), field_ids)

    def send(self, handle: Any) -> tuple[tuple[int, ...], list[int | None]]:
        """Each field's ``nvmlReturn`` and value, in the order asked; a value counts only where its
        field's return is ``NVML_SUCCESS`` (0). Raises pynvml's ``NVMLError`` (its subclass for the
        code) when the whole call fails."""
        status = self._function(handle, self._count, self._values)
        if status != 0:
            raise self._nv.NVMLError(status)
        flat = self._answers.unpack_from(self._values)
        # Sliced and mapped in C: this runs for every GPU every tick.
        return flat[1::3], list(map(decode, flat[0::3], flat[2::3]))
