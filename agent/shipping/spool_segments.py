"""Segment files: made whole under ``O_EXCL`` and ``flock``, taken over from the dead, removed.

A segment is created under a dot-name with ``O_EXCL``, locked with ``flock``,
given its header and only then renamed into place, so nobody sees a half-made
one. The writer holds the lock until the segment is deleted (or the process
dies), so two live processes never replay one segment; a segment whose lock can
be taken belongs to nobody alive and is adopted.

Which segments exist and in what order they are read is :class:`jobsight.agent.shipping.spool.Spool`'s
business; this module only handles one file at a time.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass

from jobsight.agent.shipping.spool_format import HEADER, VERSION, encode_header, scan_segment

log = logging.getLogger("jobsight.agent.spool")


@dataclass
class Segment:
    path: str
    fd: int
    entries: list[tuple[int, int]]
    """(offset, length) of each payload, in file order."""
    size: int
    writable: bool
    next: int = 0
    """Index into ``entries`` of the first batch not yet acknowledged."""
    corrupt: int = 0
    """Records skipped for a bad checksum when the segment was adopted."""

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def create_segment(directory: str, name: str) -> Segment:
    """Make ``directory/name`` with its header, locked by this process; raises ``OSError``."""
    final = os.path.join(directory, name)
    temp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, encode_header())
        os.fsync(fd)
        os.rename(temp, final)
        sync_dir(directory)
    except OSError:
        os.close(fd)
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    return Segment(final, fd, [], HEADER.size, writable=True)


def open_orphan(path: str) -> Segment | None:
    """Lock and index a segment whose writer is gone.

    ``None`` when its writer is alive, it has just been deleted, it cannot be read,
    or it is not a segment this version reads. The caller owns the returned
    segment's descriptor (and with it the lock), even when it holds no entries.
    """
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
        data = read_all(fd)
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
    return Segment(path, fd, scan.entries, len(data), writable=False, corrupt=scan.corrupt)


def remove_stale_temp(path: str) -> None:
    """Remove a half-made segment, unless the process making it still holds its lock."""
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


def remove_segment(segment: Segment) -> None:
    # Unlink before unlocking, so nobody adopts a segment that is done.
    try:
        os.unlink(segment.path)
    except OSError:
        pass
    try:
        os.close(segment.fd)
    except OSError:
        pass


def sync_dir(directory: str) -> None:
    """fsync a directory so a rename into it survives a power cut; best-effort."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_all(fd: int) -> bytes:
    """The whole of an open file, read from offset 0 whatever the descriptor's position."""
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)
