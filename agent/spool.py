"""The disk spool: batches the collector has not acknowledged yet, kept as a log.

Layout of ``<spool dir>``::

    <created_us:020d>-<pid>-<n:04d>.seg   segments, one writer process each
    rejected/<name>.json.gz + .meta.json  batches the collector refused (4xx)

A segment is a 12-byte header (``b"JSSPOOL\\n"``, version u16, reserved u16)
followed by records framed as ``length u32 | crc32 u32 | payload``; the payload is
``seq u64 | records u32 | len(source) u16 | source | gzip body``. Each record is one
already-encoded batch, so a replay sends it with its original ``(source, seq)``
and the collector deduplicates it. All integers are big-endian.

A segment is created under a dot-name with ``O_EXCL``, locked with ``flock``,
given its header and only then renamed into place, so nobody sees a half-made
one. The writer holds the lock until the segment is deleted (or the process
dies), so two live processes never replay one segment; a segment whose lock can
be taken belongs to nobody alive and is adopted. Replay reads segments in name
(creation) order; a torn last record (crash mid-write) ends the segment quietly,
a record with a bad checksum is skipped. A segment is deleted only once every
batch in it has been acknowledged or set aside in ``rejected/``.

Appends are fsynced at most once per ``fsync_interval_s`` and when a segment is
closed: a SIGKILL loses nothing (the page cache survives the process); a power
cut may lose the last second.

When the size cap (``max_bytes``, counting every segment in the directory and
``rejected/``) would be exceeded, the *newest* batch is refused (``append``
returns ``False``) and the caller counts its records as dropped. What is already
on disk is never thrown away, so a replay has no holes in the middle.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import struct
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Final, Protocol

log = logging.getLogger("jobsight.agent.spool")

MAGIC: Final = b"JSSPOOL\n"
VERSION: Final = 1
HEADER: Final = struct.Struct(">8sHH")
FRAME: Final = struct.Struct(">II")
META: Final = struct.Struct(">QIH")
SUFFIX: Final = ".seg"
REJECTED_DIR: Final = "rejected"
MAX_PAYLOAD: Final = 256 * 1024 * 1024


@dataclass(frozen=True)
class SpooledBatch:
    source: str
    seq: int
    records: int
    """How many records the batch holds (as the writer counted them)."""
    body: bytes
    """The gzip body, exactly as first encoded."""


class BatchStore(Protocol):
    """What the shipper needs from a spool; :class:`Spool` on disk, :class:`MemorySpool` without one."""

    def append(self, source: str, seq: int, records: int, body: bytes) -> bool: ...
    def peek(self) -> SpooledBatch | None: ...
    def ack(self) -> None: ...
    def reject(self, batch: SpooledBatch, status: int, detail: str) -> None: ...
    def set_aside(self, batch: SpooledBatch, status: int, detail: str) -> None: ...
    def pending(self) -> int: ...
    def adopt(self) -> int: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...
    def abandon(self) -> None: ...


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


@dataclass
class _Segment:
    path: str
    fd: int
    entries: list[tuple[int, int]]
    size: int
    writable: bool
    next: int = 0

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


class Spool:
    """A directory of segment files holding unacknowledged batches (see the module docstring).

    Not thread-safe: one thread (the shipper's worker) uses it.
    """

    def __init__(
        self,
        directory: str,
        max_bytes: int,
        *,
        segment_bytes: int = 4 * 1024 * 1024,
        fsync_interval_s: float = 1.0,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync_interval_s = fsync_interval_s
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._segments: list[_Segment] = []
        self._writer: _Segment | None = None
        self._peeked: _Segment | None = None
        self._counter = 0
        self._last_sync = time.monotonic()
        self._dirty = False
        self._others_bytes = self._foreign_bytes()
        self.corrupt_records = 0

    # -- writing -------------------------------------------------------------

    def append(self, source: str, seq: int, records: int, body: bytes) -> bool:
        """Write one batch; ``False`` when the size cap refuses it or the disk fails."""
        entry = encode_entry(source, seq, records, body)
        writer = self._writer
        if writer is not None and writer.entries and writer.size + len(entry) > self.segment_bytes:
            self._retire(writer)
            writer = None
        extra = len(entry) + (HEADER.size if writer is None else 0)
        if self.bytes_used() + extra > self.max_bytes:
            if writer is None:
                self._others_bytes = self._foreign_bytes()
            return False
        try:
            if writer is None:
                writer = self._new_segment()
            written = os.write(writer.fd, entry)
            if written != len(entry):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            log.warning("jobsight: cannot write the spool in %s: %s", self.directory, exc)
            if writer is not None:
                self._cut_back(writer)
            return False
        writer.entries.append((writer.size + FRAME.size, len(entry) - FRAME.size))
        writer.size += len(entry)
        self._dirty = True
        if time.monotonic() - self._last_sync >= self.fsync_interval_s:
            self.sync()
        return True

    def _cut_back(self, writer: _Segment) -> None:
        # Drop a partial record so later appends stay framed, then stop writing here.
        try:
            os.ftruncate(writer.fd, writer.size)
        except OSError:
            pass
        self._retire(writer)

    def _new_segment(self) -> _Segment:
        self._counter += 1
        name = f"{time.time_ns() // 1000:020d}-{os.getpid()}-{self._counter:04d}{SUFFIX}"
        final = os.path.join(self.directory, name)
        temp = os.path.join(self.directory, f".{name}.tmp")
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, HEADER.pack(MAGIC, VERSION, 0))
            os.fsync(fd)
            os.rename(temp, final)
            self._sync_dir()
        except OSError:
            os.close(fd)
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
        segment = _Segment(final, fd, [], HEADER.size, writable=True)
        self._segments.append(segment)
        self._writer = segment
        self._others_bytes = self._foreign_bytes()
        return segment

    def _retire(self, segment: _Segment) -> None:
        if segment.writable:
            segment.writable = False
            self._fsync(segment)
        if self._writer is segment:
            self._writer = None
        if segment.next >= len(segment.entries):
            self._delete(segment)

    def sync(self) -> None:
        """fsync the segment being written, if anything was appended since the last sync."""
        if self._writer is not None and self._dirty:
            self._fsync(self._writer)
        self._last_sync = time.monotonic()

    def _fsync(self, segment: _Segment) -> None:
        try:
            os.fsync(segment.fd)
        except OSError as exc:
            log.warning("jobsight: fsync of %s failed: %s", segment.path, exc)
        self._dirty = False

    def _sync_dir(self) -> None:
        try:
            fd = os.open(self.directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    # -- reading -------------------------------------------------------------

    def pending(self) -> int:
        return sum(len(s.entries) - s.next for s in self._segments)

    def peek(self) -> SpooledBatch | None:
        """The oldest batch not yet acknowledged, or ``None`` when the spool is empty."""
        for segment in self._segments:
            while segment.next < len(segment.entries):
                offset, length = segment.entries[segment.next]
                try:
                    payload = os.pread(segment.fd, length, offset)
                    if len(payload) != length:
                        raise OSError(errno.EIO, "short read")
                    batch = decode_payload(payload)
                except (OSError, UnicodeDecodeError, struct.error) as exc:
                    log.warning("jobsight: skipping unreadable spool record in %s: %s", segment.path, exc)
                    self.corrupt_records += 1
                    segment.next += 1
                    continue
                self._peeked = segment
                return batch
        return None

    def ack(self) -> None:
        """The batch last returned by :meth:`peek` was acknowledged: move past it."""
        segment = self._peeked
        if segment is None:
            return
        self._peeked = None
        segment.next += 1
        if segment.next >= len(segment.entries):
            self._retire(segment)

    def reject(self, batch: SpooledBatch, status: int, detail: str) -> None:
        """Set the batch last peeked aside in ``rejected/`` and move past it."""
        self.set_aside(batch, status, detail)
        self.ack()

    def set_aside(self, batch: SpooledBatch, status: int, detail: str) -> None:
        """Keep a batch the collector refused in ``rejected/``, for a person to look at."""
        folder = os.path.join(self.directory, REJECTED_DIR)
        meta = json.dumps(
            {"source": batch.source, "seq": batch.seq, "records": batch.records, "status": status, "detail": detail}
        ).encode()
        if self.bytes_used() + len(batch.body) + len(meta) > self.max_bytes:
            log.warning("jobsight: spool full; not keeping rejected batch %s/%d", batch.source, batch.seq)
            return
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in batch.source)
        stem = f"{time.time_ns() // 1000:020d}-{safe}-{batch.seq}"
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            for suffix, data in ((".json.gz", batch.body), (".meta.json", meta)):
                fd = os.open(os.path.join(folder, stem + suffix), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
        except OSError as exc:
            log.warning("jobsight: cannot keep rejected batch in %s: %s", folder, exc)
        self._others_bytes += len(batch.body) + len(meta)

    # -- ownership -----------------------------------------------------------

    def adopt(self) -> int:
        """Take over segments whose writer is gone; returns how many batches that adds."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return 0
        mine = {s.name for s in self._segments}
        added = 0
        for name in names:
            path = os.path.join(self.directory, name)
            if name.startswith(".") and name.endswith(".tmp"):
                self._remove_stale_temp(path)
                continue
            if not name.endswith(SUFFIX) or name in mine:
                continue
            segment = self._try_adopt(path)
            if segment is not None:
                self._segments.append(segment)
                added += len(segment.entries)
        if added:
            # Oldest first; a name starts with its creation time.
            self._segments.sort(key=lambda s: s.name)
        self._others_bytes = self._foreign_bytes()
        return added

    def _try_adopt(self, path: str) -> _Segment | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # its writer is alive
            return None
        try:
            if os.fstat(fd).st_nlink == 0:
                raise FileNotFoundError(path)  # deleted by its owner just before we locked it
            data = _read_all(fd)
        except OSError:
            os.close(fd)
            return None
        scan = scan_segment(data)
        if scan is None:
            log.warning("jobsight: leaving %s alone: not a version %d spool segment", path, VERSION)
            os.close(fd)
            return None
        if scan.corrupt:
            log.warning("jobsight: %d corrupt record(s) skipped in %s", scan.corrupt, path)
            self.corrupt_records += scan.corrupt
        segment = _Segment(path, fd, scan.entries, len(data), writable=False)
        if not segment.entries:
            self._delete(segment)
            return None
        return segment

    def _remove_stale_temp(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _delete(self, segment: _Segment) -> None:
        # Unlink before unlocking, so nobody adopts a segment that is done.
        try:
            os.unlink(segment.path)
        except OSError:
            pass
        try:
            os.close(segment.fd)
        except OSError:
            pass
        if segment in self._segments:
            self._segments.remove(segment)
        if self._writer is segment:
            self._writer = None

    # -- accounting and lifetime -------------------------------------------------

    def bytes_used(self) -> int:
        """Bytes this process holds plus what other processes' segments and ``rejected/`` held at the last look."""
        return sum(s.size for s in self._segments) + self._others_bytes

    def _foreign_bytes(self) -> int:
        mine = {s.name for s in self._segments}
        total = 0
        for folder, only_segments in ((self.directory, True), (os.path.join(self.directory, REJECTED_DIR), False)):
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if only_segments and (not entry.name.endswith(SUFFIX) or entry.name in mine):
                    continue
                try:
                    total += entry.stat().st_size
                except OSError:
                    continue
        return total

    def close(self) -> None:
        """fsync and release every segment; unacknowledged ones stay for the next process."""
        self.sync()
        for segment in list(self._segments):
            if segment.next >= len(segment.entries):
                self._delete(segment)
            else:
                try:
                    os.close(segment.fd)
                except OSError:
                    pass
        self._segments.clear()
        self._writer = None

    def abandon(self) -> None:
        """In a forked child: let go of the parent's descriptors without touching its files."""
        for segment in self._segments:
            try:
                os.close(segment.fd)
            except OSError:
                pass
        self._segments.clear()
        self._writer = None


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


class MemorySpool:
    """The fallback when the spool directory cannot be used: same contract, lost at exit."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: deque[SpooledBatch] = deque()
        self._bytes = 0

    def append(self, source: str, seq: int, records: int, body: bytes) -> bool:
        if self._bytes + len(body) > self.max_bytes:
            return False
        self._items.append(SpooledBatch(source, seq, records, body))
        self._bytes += len(body)
        return True

    def peek(self) -> SpooledBatch | None:
        return self._items[0] if self._items else None

    def ack(self) -> None:
        if self._items:
            self._bytes -= len(self._items.popleft().body)

    def reject(self, batch: SpooledBatch, status: int, detail: str) -> None:
        self.ack()

    def set_aside(self, batch: SpooledBatch, status: int, detail: str) -> None:
        pass

    def pending(self) -> int:
        return len(self._items)

    def adopt(self) -> int:
        return 0

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abandon(self) -> None:
        self._items.clear()
        self._bytes = 0
