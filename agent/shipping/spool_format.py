"""The bytes of a spool segment: a versioned header, then length + CRC framed records.

A segment is a 12-byte header (``b"JSSPOOL\\n"``, version u16, reserved u16)
followed by records framed as ``length u32 | crc32 u32 | payload``; the payload is
``seq u64 | records u32 | len(source) u16 | source | gzip body``. Each record is one
already-encoded batch, so a replay sends it with its original ``(source, seq)``
and the collector deduplicates it. All integers are big-endian.

This module only turns batches into bytes and back; the files themselves are
:mod:`jobsight.agent.shipping.spool_segments`' and :mod:`jobsight.agent.shipping.spool`'s business.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Final

MAGIC: Final = b"JSSPOOL\n"
VERSION: Final = 1
HEADER: Final = struct.Struct(">8sHH")
FRAME: Final = struct.Struct(">II")
META: Final = struct.Struct(">QIH")
MAX_PAYLOAD: Final = 256 * 1024 * 1024


@dataclass(frozen=True)
class SpooledBatch:
    source: str
    seq: int
    records: int
    """How many records the batch holds (as the writer counted them)."""
    body: bytes
    """The gzip body, exactly as first encoded."""


def encode_header() -> bytes:
    """The header every segment starts with."""
    return HEADER.pack(MAGIC, VERSION, 0)


def encode_entry(source: str, seq: int, records: int, body: bytes) -> bytes:
    """One framed spool record."""
    raw_source = source.encode()
    payload = META.pack(seq, records, len(raw_source)) + raw_source + body
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def decode_payload(payload: bytes) -> SpooledBatch:
    seq, records, source_len = META.unpack_from(payload)
    start = META.size
    source = payload[start : start + source_len].decode()
    return SpooledBatch(source, seq, records, payload[start + source_len :])


@dataclass
class ScanResult:
    entries: list[tuple[int, int]] = field(default_factory=list)
    """(offset, length) of each good payload, in file order."""
    torn: bool = False
    corrupt: int = 0
    end: int = 0
    """Offset just past the last whole record."""


def scan_segment(data: bytes) -> ScanResult | None:
    """Index a segment's records; ``None`` when the header is not one this version reads."""
    if len(data) < HEADER.size:
        return None
    magic, version, _ = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        return None
    result = ScanResult(end=HEADER.size)
    offset = HEADER.size
    while offset < len(data):
        if len(data) - offset < FRAME.size:
            result.torn = True
            break
        length, crc = FRAME.unpack_from(data, offset)
        start = offset + FRAME.size
        if length > MAX_PAYLOAD or start + length > len(data):
            # A crash mid-append (or a garbled length): nothing after it can be framed.
            result.torn = True
            break
        if zlib.crc32(data[start : start + length]) == crc and length >= META.size:
            result.entries.append((start, length))
        else:
            result.corrupt += 1
        offset = start + length
        result.end = offset
    return result
