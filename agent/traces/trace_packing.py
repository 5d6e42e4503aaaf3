"""A trace packed for the wire: gzip, then base64, within the caps the collector keeps."""

from __future__ import annotations

import base64
import gzip

from jobsight.protocol import wire


def pack_trace(raw: bytes, cap_bytes: int) -> tuple[str | None, str | None]:
    """The trace as base64 of gzip, or ``None`` and a note when it is over the cap (gzipped), or
    over what the collector lets a trace inflate to (``wire.MAX_TRACE_INFLATED``): it would
    refuse the whole batch."""
    if len(raw) > wire.MAX_TRACE_INFLATED:
        note = (
            f"trace left out: {len(raw) / 1e6:.1f} MB is over the collector's cap of "
            f"{wire.MAX_TRACE_INFLATED / 1e6:.1f} MB (profile fewer steps); summary only"
        )
        return None, note
    cap = min(cap_bytes, wire.MAX_TRACE_B64 * 3 // 4)
    packed = gzip.compress(raw, compresslevel=6)
    if len(packed) > cap:
        note = (
            f"trace left out: {len(packed) / 1e6:.1f} MB gzipped is over the cap of {cap / 1e6:.1f} MB "
            "(profile fewer steps, or raise trace_cap_bytes); summary only"
        )
        return None, note
    return base64.b64encode(packed).decode("ascii"), None
