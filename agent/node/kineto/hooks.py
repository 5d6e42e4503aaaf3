"""What the Slurm hooks need of the Kineto service, with the standard library alone.

* :func:`kineto_serving`: whether the node daemon says, freshly, that it answers PyTorch's profiler
  (the task prolog exports ``KINETO_USE_DAEMON=1`` only then: a job is never pointed at a socket
  nobody serves, or that someone else could have bound).
* :func:`kineto_socket_dir_for`: the ``KINETO_IPC_SOCKET_DIR`` of a user's tasks.
* :func:`prepare_kineto_socket_dir`: the prolog (root) makes that directory before any task
  starts: Kineto binds its client socket there once, when it starts, and a process that finds no
  directory then never asks the daemon at all.
* :func:`remove_job_traces`: the epilog removes ``<trace dir>/<job>/``, a directory its user owns,
  without following anything the user planted in it.

The status file (``/run/jobsight/agent-status.json``) is the daemon's: root's, rewritten every
:data:`STATUS_HEARTBEAT_S` while it serves, with ``updated_at`` (seconds since the epoch).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Final

from jobsight.agent.node.registrations import RegistrationError, check_job_id
from jobsight.agent.settings import AgentSettings

log = logging.getLogger("jobsight.agent.kineto")

STATUS_NAME: Final = "agent-status.json"
STATUS_HEARTBEAT_S: Final = 5.0
STATUS_FRESH_S: Final = 30.0
"""A status older than this says nothing: the daemon may be gone (killed, stopped, hung)."""
STATUS_FUTURE_S: Final = 5.0
"""A stamp this far ahead of the clock is not trusted either (a clock stepped back)."""
MAX_STATUS_BYTES: Final = 64 * 1024
MAX_TREE_DEPTH: Final = 64
MAX_TREE_ENTRIES: Final = 100_000
"""The epilog removes at most this many entries of a job's trace directory (a user could make
millions); what is left is logged and removed by no one else, but costs the node nothing more."""


def status_path_for(registration_dir: str | os.PathLike[str]) -> Path:
    """The node daemon's status file, beside the registrations: ``/run/jobsight/agent-status.json``."""
    return Path(registration_dir).parent / STATUS_NAME


def kineto_socket_dir_for(settings: AgentSettings, uid: int) -> str | None:
    """``KINETO_IPC_SOCKET_DIR`` for the tasks of ``uid``: its own socket directory; ``None`` when
    the site opted into the abstract name (then nothing is exported)."""
    if settings.kineto_uses_abstract_socket() or settings.kineto_socket_dir is None:
        return None
    return os.path.join(settings.kineto_socket_dir, str(uid))


def prepare_kineto_socket_dir(settings: AgentSettings, uid: int) -> str | None:
    """Make ``<socket dir>/<uid>`` the user's (0700) when the daemon's socket directory exists;
    returns it, or ``None`` (abstract name, no daemon directory, or it could not be made). Root
    only; never raises."""
    if kineto_socket_dir_for(settings, uid) is None or settings.kineto_socket_dir is None:
        return None
    try:
        from jobsight.agent.node.kineto.sockets import prepare_user_dir

        return prepare_user_dir(settings.kineto_socket_dir, uid)
    except (OSError, ImportError) as exc:
        log.warning("uid %d: cannot prepare the profiler socket directory: %s", uid, exc)
        return None


def kineto_serving(status_file: str | os.PathLike[str], *, max_age_s: float = STATUS_FRESH_S,
                   owner_uid: int = 0, now: float | None = None) -> bool:
    """Whether the node daemon's status says it serves Kineto, written at most ``max_age_s`` ago.

    ``False`` for a missing, stale, unreadable or malformed status, one that is a link or not a
    regular file, or not owned by ``owner_uid`` (root: the daemon). Never raises."""
    try:
        status = _read_status(status_file, owner_uid)
        kineto = status.get("kineto")
        updated = status.get("updated_at")
        if not isinstance(kineto, dict) or kineto.get("serving") is not True:
            return False
        if isinstance(updated, bool) or not isinstance(updated, int | float):
            return False
        age = (time.time() if now is None else now) - float(updated)
        return -STATUS_FUTURE_S <= age <= max_age_s
    except Exception:  # noqa: BLE001 - boundary: a hook's question, never its failure
        return False


def _read_status(path: str | os.PathLike[str], owner_uid: int) -> dict[str, object]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner_uid or info.st_size > MAX_STATUS_BYTES:
            return {}
        raw = os.read(fd, MAX_STATUS_BYTES + 1)
    finally:
        os.close(fd)
    data = json.loads(raw[:MAX_STATUS_BYTES])
    return data if isinstance(data, dict) else {}


def remove_job_traces(trace_dir: str, job: str) -> None:
    """Remove ``<trace_dir>/<job>/`` and everything in it; never raises.

    The directory is the job's user's: every entry is opened relative to its parent's descriptor
    with ``O_NOFOLLOW``, and a link is removed, never followed, so nothing outside is touched."""
    try:
        check_job_id(job)
        root = os.open(trace_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, RegistrationError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("job %s: traces not removed: %s", job, exc)
        return
    try:
        left = _remove_entry(root, job, 0, [MAX_TREE_ENTRIES])
        if left:
            log.warning("job %s: %s/%s not fully removed (deeper than %d or more than %d entries)", job, trace_dir,
                        job, MAX_TREE_DEPTH, MAX_TREE_ENTRIES)
    except Exception as exc:  # noqa: BLE001 - boundary: the epilog goes on whatever is left here
        log.warning("job %s: traces not removed: %s", job, exc)
    finally:
        os.close(root)


def _remove_entry(parent_fd: int, name: str, depth: int, budget: list[int]) -> bool:
    """Remove ``name`` in ``parent_fd`` (a tree, a file or a link); ``True`` if something is left."""
    if budget[0] <= 0:
        return True
    budget[0] -= 1
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        os.unlink(name, dir_fd=parent_fd)  # a file, or a link (removed itself, never followed)
        return False
    try:
        if depth >= MAX_TREE_DEPTH:
            return True
        left = False
        for child in os.listdir(fd):
            left = _remove_entry(fd, child, depth + 1, budget) or left
    finally:
        os.close(fd)
    if left:
        return True
    os.rmdir(name, dir_fd=parent_fd)
    return False
