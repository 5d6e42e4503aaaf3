"""The trace files Kineto writes for the daemon's windows, read without trusting them.

Kineto runs as the job's user and writes into ``<trace root>/<job>/``, a directory that user owns
(0700) in a root-owned root (0711: users reach their own job's directory, list nobody's). The
daemon names the file (``ACTIVITIES_LOG_FILE``) and Kineto adds the pid before ``.json``, so a
window's trace is one of exactly two names: no pattern that another pid's file could match.

A file is read only if it is a regular file (not a link) owned by the job's uid, under the size
cap; it is parsed and summarised by the caller inside one boundary (:func:`parse_trace` only
checks its shape), and whatever fails ends the window with the reason.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from jobsight.agent.node.registrations import check_job_id

TRACE_ROOT_MODE: Final = 0o711
JOB_DIR_MODE: Final = 0o700
READ_CHUNK: Final = 1 << 20


class TraceRefused(Exception):
    """The trace file is not one the daemon may read; the message says why."""


@dataclass
class Window:
    """One trace asked of one process."""

    request_id: int
    job: str
    rank: int
    pid: int
    uid: int
    directory: Path
    steps: int
    given_at: float
    seen_size: int = -1


def trace_path(window: Window) -> Path:
    """The file named in the window's config."""
    return window.directory / f"request{window.request_id}_rank{window.rank}_pid{window.pid}.json"


def trace_candidates(window: Window) -> list[Path]:
    """Where Kineto writes the window's trace: the name given, or that name with ``_<pid>``
    before ``.json`` (what Kineto does to an on-demand log file). Exactly these two: a pattern
    such as ``pid12*`` would take pid 123's file too."""
    named = trace_path(window)
    return [named, named.with_name(f"{named.stem}_{window.pid}.json")]


def read_trace(path: Path, uid: int, cap_bytes: int) -> bytes:
    """The trace's bytes, if it is a regular file (not a link) owned by ``uid``, at most
    ``cap_bytes``; :class:`TraceRefused` says why not. ``FileNotFoundError`` when it is not there yet."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise TraceRefused(f"cannot open the trace without following links: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TraceRefused("the trace is not a regular file")
        if info.st_uid != uid:
            raise TraceRefused(f"the trace is owned by uid {info.st_uid}, not the job's {uid}")
        if info.st_size > cap_bytes:
            raise TraceRefused(f"the trace is {info.st_size / 1e6:.1f} MB, over the cap of {cap_bytes / 1e6:.1f} MB")
        chunks = []
        left = cap_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        raw = b"".join(chunks)
    finally:
        os.close(fd)
    if len(raw) > cap_bytes:
        raise TraceRefused(f"the trace grew over the cap of {cap_bytes / 1e6:.1f} MB")
    return raw


def parse_trace(raw: bytes) -> list[dict[str, Any]]:
    """The trace's events: a JSON object whose ``traceEvents`` is a list of objects.
    :class:`TraceRefused` otherwise (not JSON, nested past the parser's depth, another shape)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise TraceRefused("the trace is nested too deeply to be a trace") from None
    except ValueError as exc:
        raise TraceRefused(f"the trace is not valid JSON: {exc}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise TraceRefused("the trace has no traceEvents list")
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceRefused(f"trace event {index} is not an object")
    return events


def remove_trace_files(window: Window) -> None:
    """Remove the window's files (a link itself, never what it points to); best effort."""
    for path in trace_candidates(window):
        try:
            os.unlink(path)
        except OSError:
            pass


def prepare_trace_root(trace_root: Path) -> str | None:
    """Make the trace root root's and 0711; returns a warning when job users cannot reach it
    (an ancestor without search permission for others: Kineto could write no trace there)."""
    os.makedirs(trace_root, mode=TRACE_ROOT_MODE, exist_ok=True)
    fd = os.open(trace_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{trace_root} is not the daemon's")
        os.fchmod(fd, TRACE_ROOT_MODE)
    finally:
        os.close(fd)
    for parent in Path(os.path.abspath(trace_root)).parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return (f"{parent} is not searchable by other users: jobs cannot write traces under {trace_root} "
                    "(systemd's StateDirectoryMode= must be 0711)")
    return None


def prepare_job_dir(trace_root: Path, job: str, uid: int) -> Path:
    """``<trace root>/<job>/``, the job user's, mode 0700 (made if missing). Only root creates
    entries in the trace root, so the name cannot be a link the user placed."""
    check_job_id(job)
    root_fd = os.open(trace_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.mkdir(job, JOB_DIR_MODE, dir_fd=root_fd)
        except FileExistsError:
            pass
        fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
        try:
            os.fchown(fd, uid, -1)
            os.fchmod(fd, JOB_DIR_MODE)
        finally:
            os.close(fd)
    finally:
        os.close(root_fd)
    return trace_root / job
