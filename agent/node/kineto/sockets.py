"""Where the node daemon answers Kineto: one socket file per user, or the abstract name by opt-in.

Kineto finds the daemon at ``$KINETO_IPC_SOCKET_DIR/dynolog`` and binds its own client socket,
``dynoconfigclient<uuid>`` (mode 0666), in that same directory. So the directory must let the job's
user create sockets, and whoever may create them there may also answer or flood them. The layout
that holds against the other users of a node (``settings.kineto_socket_dir``, default
``/run/jobsight/kineto``)::

    /run/jobsight/kineto/          root's, 0711: only root creates entries (no user can bind
                                   ``dynolog`` anywhere a job will look, restart or not)
    /run/jobsight/kineto/.lock     root's: one daemon per directory (a second one steps aside)
    /run/jobsight/kineto/<uid>/    the user's, 0700, made by the daemon for each uid with a job here;
                                   the task prolog exports it as KINETO_IPC_SOCKET_DIR
    /run/jobsight/kineto/<uid>/dynolog   bound by the daemon, given to the user, 0600

Why per user and not one shared sticky directory: with one socket every local user shares one
receive queue (``net.unix.max_dgram_qlen``, 10 by default) and a user who floods it with blocking
sends keeps it full, so other users' processes (which send with ``MSG_DONTWAIT``) get ``EAGAIN``
and no answer: a rate limit in the daemon cannot fix what happens before the daemon reads. Per
user, the kernel itself refuses other users (no search permission on the directory, no write
permission on the socket): a flood fills only its own user's queue; the client sockets are out
of other users' reach too (Kineto accepts a config from any sender that can reach it). The user
owns its directory, so the daemon binds there without following anything the user placed (see
:class:`~jobsight.agent.node.kineto.endpoint.KinetoEndpoint`), and a user who replaces its own socket only deprives
its own processes.

The abstract name (``kineto_abstract_socket``) is what Dynolog uses: any local process can bind it
first, flood it, or reach the clients. docs/profiling.md says so.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import stat
from collections.abc import Callable
from typing import Final, Protocol

from jobsight.agent.node.kineto.endpoint import EndpointBusy, KinetoEndpoint, UidRateLimit

log = logging.getLogger("jobsight.agent.kineto")

TOP_DIR_MODE: Final = 0o711
USER_DIR_MODE: Final = 0o700
LOCK_NAME: Final = ".lock"
LINGER_S: Final = 300.0
"""A user's socket stays this long after its last job here left (a next job finds it ready)."""
CHECK_S: Final = 10.0
"""How often each user's socket file is checked to still be the daemon's (rebound if not)."""
RETRY_S: Final = 10.0
"""A user's socket that could not be made is tried again after this long."""


class Sockets(Protocol):
    """The endpoints one serving thread reads, kept in step with the users that have jobs here."""

    @property
    def address(self) -> str: ...

    def endpoints(self) -> list[KinetoEndpoint]: ...

    def sync(self, uids: set[int]) -> None: ...

    def close(self) -> None: ...


def user_socket_dir(socket_dir: str, uid: int) -> str:
    """The directory a process of ``uid`` is told (``KINETO_IPC_SOCKET_DIR``)."""
    return os.path.join(socket_dir, str(uid))


class SharedSocket:
    """The abstract name every process of the node reaches (opt-in; Dynolog's way)."""

    def __init__(self, name: str, limit: UidRateLimit) -> None:
        self._endpoint = KinetoEndpoint(name, limit=limit)
        self.address = self._endpoint.address

    def endpoints(self) -> list[KinetoEndpoint]:
        return [self._endpoint]

    def sync(self, uids: set[int]) -> None:
        return None

    def close(self) -> None:
        self._endpoint.close()


class UserSockets:
    """One socket per user with a job on this node, under a root-owned directory."""

    def __init__(self, socket_dir: str, name: str, limit: UidRateLimit, clock: Callable[[], float]) -> None:
        self.socket_dir = socket_dir
        self.address = os.path.join(socket_dir, "<uid>", name)
        self._name = name
        self._limit = limit
        self._clock = clock
        self._open: dict[int, KinetoEndpoint] = {}
        self._wanted_at: dict[int, float] = {}
        self._failed_at: dict[int, float] = {}
        self._failed_why: dict[int, str] = {}
        """The last failure logged per uid: a user can make its own socket fail, and the retries
        every :data:`RETRY_S` must not fill the daemon's log."""
        self._checked_at = clock()
        self._dir_fd = _open_top_dir(socket_dir)
        try:
            self._lock_fd = _take_lock(self._dir_fd, socket_dir)
        except BaseException:
            os.close(self._dir_fd)
            raise

    def endpoints(self) -> list[KinetoEndpoint]:
        return list(self._open.values())

    def sync(self, uids: set[int]) -> None:
        """Open a socket for each of ``uids`` (the users with a job here), close the ones whose
        users left :data:`LINGER_S` ago, and rebind any whose file is no longer the daemon's."""
        now = self._clock()
        for uid in uids:
            self._wanted_at[uid] = now
        for uid, at in list(self._wanted_at.items()):
            if now - at > LINGER_S:
                self._drop(uid)
        if now - self._checked_at > CHECK_S:
            self._checked_at = now
            for uid in [u for u, endpoint in self._open.items() if not endpoint.intact()]:
                log.warning("jobsight agent: profiler socket of uid %d was removed or replaced; binding it again", uid)
                self._open.pop(uid).close()
        for uid in self._wanted_at:
            if uid not in self._open and now - self._failed_at.get(uid, -RETRY_S * 2) > RETRY_S:
                self._bind_for(uid, now)

    def close(self) -> None:
        for uid in list(self._open):
            self._open.pop(uid).close()
        os.close(self._lock_fd)
        os.close(self._dir_fd)

    def _drop(self, uid: int) -> None:
        self._wanted_at.pop(uid, None)
        self._failed_at.pop(uid, None)
        self._failed_why.pop(uid, None)
        endpoint = self._open.pop(uid, None)
        if endpoint is not None:
            endpoint.close()

    def _bind_for(self, uid: int, now: float) -> None:
        try:
            _prepare_user_dir(self._dir_fd, uid)
            self._open[uid] = KinetoEndpoint(self._name, user_socket_dir(self.socket_dir, uid), owner_uid=uid,
                                             take_over=True, limit=self._limit)
            self._failed_at.pop(uid, None)
            self._failed_why.pop(uid, None)
        except (OSError, ValueError, EndpointBusy) as exc:
            self._failed_at[uid] = now
            if self._failed_why.get(uid) != str(exc):
                self._failed_why[uid] = str(exc)
                log.warning("jobsight agent: cannot open the profiler socket of uid %d: %s", uid, exc)


def prepare_user_dir(socket_dir: str, uid: int) -> str | None:
    """``<socket_dir>/<uid>``, made the user's (0700) if the daemon's socket directory exists;
    ``None`` otherwise. For the prolog (root): a job's processes bind their own client sockets
    there as soon as they start, so it must exist before the first of them does (the daemon makes
    it too, but only once it has seen the job's registration)."""
    try:
        fd = os.open(socket_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return None  # not root's: the daemon would refuse it too
        _prepare_user_dir(fd, uid)
    finally:
        os.close(fd)
    return user_socket_dir(socket_dir, uid)


def wait_readable(endpoints: list[KinetoEndpoint], timeout: float) -> list[KinetoEndpoint]:
    """The endpoints with a datagram waiting, after at most ``timeout`` seconds."""
    if not endpoints:
        return []
    poller = select.poll()
    by_fd = {}
    for endpoint in endpoints:
        poller.register(endpoint.fileno(), select.POLLIN)
        by_fd[endpoint.fileno()] = endpoint
    return [by_fd[fd] for fd, _ in poller.poll(max(0, int(timeout * 1000))) if fd in by_fd]


def _open_top_dir(socket_dir: str) -> int:
    """The socket directory, made or checked: root's (this process's uid), writable by it alone,
    in a parent that others cannot rename it out of. ``OSError`` says why not."""
    parent = os.path.dirname(socket_dir.rstrip("/")) or "/"
    os.makedirs(parent, 0o755, exist_ok=True)  # /run/jobsight: the daemon may start before any prolog
    info = os.stat(parent)
    if info.st_uid != os.geteuid() or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
        raise OSError(errno.EPERM, f"{parent} is writable by others: no socket directory in it")
    try:
        os.mkdir(socket_dir, TOP_DIR_MODE)
    except FileExistsError:
        pass
    fd = os.open(socket_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{socket_dir} belongs to uid {os.fstat(fd).st_uid}, not to the daemon's")
        os.fchmod(fd, TOP_DIR_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _take_lock(dir_fd: int, socket_dir: str) -> int:
    fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise EndpointBusy(f"another jobsight agent serves the profiler sockets in {socket_dir}") from None
    return fd


def _prepare_user_dir(dir_fd: int, uid: int) -> None:
    """``<socket dir>/<uid>``: a directory that is the user's, mode 0700. Only root creates entries
    in the socket directory, so what is found under the name is root's doing and is replaced when
    it is not a directory."""
    name = str(uid)
    for _ in range(2):
        try:
            os.mkdir(name, USER_DIR_MODE, dir_fd=dir_fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            os.unlink(name, dir_fd=dir_fd)
            continue
        try:
            os.fchown(fd, uid, -1)
            os.fchmod(fd, USER_DIR_MODE)
        finally:
            os.close(fd)
        return
    raise OSError(errno.EEXIST, f"cannot make the socket directory of uid {uid}")
