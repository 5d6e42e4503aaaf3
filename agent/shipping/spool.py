"""The disk spool: batches the collector has not acknowledged yet, kept as a log.

Layout of ``<spool dir>``::

    <created_us:020d>-<pid>-<n:04d>.seg   segments, one writer process each
    rejected/<name>.json.gz + .meta.json  batches the collector refused (4xx), and those
                                          quarantined after failing the same way too
                                          long (:mod:`jobsight.agent.shipping.poison`)

How a segment's bytes are framed is :mod:`jobsight.agent.shipping.spool_format`'s; how one is
created, locked and adopted is :mod:`jobsight.agent.shipping.spool_segments`'. Replay reads
segments in name (creation) order; a torn last record (crash mid-write) ends the
segment quietly, a record with a bad checksum is skipped. A segment is deleted
only once every batch in it has been acknowledged or set aside in ``rejected/``.

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
import json
import logging
import os
import struct
import time
from typing import Final

from jobsight.agent.shipping.spool_format import FRAME, HEADER, SpooledBatch, decode_payload, encode_entry
from jobsight.agent.shipping.spool_segments import (
    Segment,
    create_segment,
    open_orphan,
    remove_segment,
    remove_stale_temp,
)

log = logging.getLogger("jobsight.agent.spool")

SUFFIX: Final = ".seg"
REJECTED_DIR: Final = "rejected"


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
        self._segments: list[Segment] = []
        self._writer: Segment | None = None
        self._peeked: Segment | None = None
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

    def _cut_back(self, writer: Segment) -> None:
        # Drop a partial record so later appends stay framed, then stop writing here.
        try:
            os.ftruncate(writer.fd, writer.size)
        except OSError:
            pass
        self._retire(writer)

    def _new_segment(self) -> Segment:
        self._counter += 1
        name = f"{time.time_ns() // 1000:020d}-{os.getpid()}-{self._counter:04d}{SUFFIX}"
        segment = create_segment(self.directory, name)
        self._segments.append(segment)
        self._writer = segment
        self._others_bytes = self._foreign_bytes()
        return segment

    def _retire(self, segment: Segment) -> None:
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

    def _fsync(self, segment: Segment) -> None:
        try:
            os.fsync(segment.fd)
        except OSError as exc:
            log.warning("jobsight: fsync of %s failed: %s", segment.path, exc)
        self._dirty = False

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

    def reject(self, batch: SpooledBatch, status: int, detail: str, quarantined: str | None = None) -> None:
        """Set the batch last peeked aside in ``rejected/`` and move past it."""
        self.set_aside(batch, status, detail, quarantined)
        self.ack()

    def set_aside(self, batch: SpooledBatch, status: int, detail: str, quarantined: str | None = None) -> None:
        """Keep a batch the collector refused in ``rejected/``, for a person to look at.

        ``quarantined`` is why a batch that was never refused outright (it kept failing
        with the same 5xx) was set aside; its meta file says so under that key.
        """
        folder = os.path.join(self.directory, REJECTED_DIR)
        fields: dict[str, object] = {
            "source": batch.source, "seq": batch.seq, "records": batch.records, "status": status, "detail": detail
        }
        if quarantined is not None:
            fields["quarantined"] = quarantined
        meta = json.dumps(fields).encode()
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
                remove_stale_temp(path)
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

    def _try_adopt(self, path: str) -> Segment | None:
        segment = open_orphan(path)
        if segment is None:
            return None
        self.corrupt_records += segment.corrupt
        if not segment.entries:
            self._delete(segment)
            return None
        return segment

    def _delete(self, segment: Segment) -> None:
        remove_segment(segment)
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
