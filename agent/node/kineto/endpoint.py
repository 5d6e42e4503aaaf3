"""The node-local socket PyTorch's profiler (Kineto) polls when ``KINETO_USE_DAEMON=1`` is set.

Kineto sends its requests to a Unix datagram socket named ``dynolog``: by default the abstract
address ``"\\0dynolog\\0"`` (the name is bracketed by NULs and the address length counts both), or,
when the process has ``KINETO_IPC_SOCKET_DIR`` set, the file ``<dir>/dynolog``. Each client binds
its own ``dynoconfigclient<uuid>`` name next to it and expects the answer there within about 0.1 s
(nine 10 ms receive attempts); a later answer is read as the reply to its *next* poll.

:class:`KinetoEndpoint` binds that socket and answers one datagram per :meth:`~KinetoEndpoint.serve_once`.
The kernel attaches the sender's (pid, uid, gid) to every datagram (``SO_PASSCRED``), so the
caller's ``decide`` callback can judge a request by who really sent it rather than by what the
request claims. Abstract names are per network namespace; pids in the credentials are in this
process's pid namespace, the request's own pids in the sender's.

A site that runs Dynolog already holds the name: binding then raises :class:`EndpointBusy` and the
caller steps aside. Hostile or broken datagrams are dropped and reported, never raised; so is a
``decide`` that fails (the sender still gets "no config").

A socket file is bound through the directory's file descriptor and given its mode (and owner)
through an ``O_PATH`` descriptor that is checked first (a socket, this process's, one link), so
the directory may belong to the user whose processes it serves (:mod:`~jobsight.agent.node.kineto.sockets`): a link
or another file swapped in under the name is never chmod-ed or chown-ed.

:class:`UidRateLimit` caps the datagrams each uid may have read and answered per second; the
rest are read and dropped before any parsing, so a flooding user costs one ``recvmsg`` each.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Final

from jobsight.agent.node.kineto.wire import (
    CONTEXT,
    MAX_DATAGRAM_BYTES,
    KinetoRequest,
    MalformedDatagram,
    encode_config_reply,
    encode_context_reply,
    parse_datagram,
)

DEFAULT_NAME: Final = "dynolog"
MAX_NAME_BYTES: Final = 106
"""``sun_path`` is 108 bytes; an abstract name spends one on the leading and one on the trailing NUL."""
UCRED: Final = struct.Struct("=iII")
CREDENTIALS_SPACE: Final = socket.CMSG_SPACE(UCRED.size)
SOCKET_FILE_MODE: Final = 0o666
"""Any user's training process must be able to send to a shared socket file, as Dynolog allows."""
OWNED_SOCKET_FILE_MODE: Final = 0o600
"""A socket file given to one user (``owner_uid``): only that user's processes may send to it."""
REGISTERED_REPLY: Final = 1
"""Answer to a "ctxt" registration; Kineto only checks that one arrives."""
BIND_TRIES: Final = 3
"""Binding over a name that reappears (its directory's owner recreating it) is tried this often."""
RATE_PER_UID_S: Final = 20.0
"""Datagrams a second each uid may have answered. Kineto polls every few seconds per process, so a
node's worth of one user's processes stays far below; a flood is cut to this."""
BURST_PER_UID: Final = 40.0
"""What a uid may send at once (all of a job's processes starting together)."""
MAX_TRACKED_UIDS: Final = 4096


class UidRateLimit:
    """A token bucket per sender uid. Not thread-safe: one serving thread uses it."""

    def __init__(self, rate_per_s: float = RATE_PER_UID_S, burst: float = BURST_PER_UID,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.clock = clock
        self.dropped: dict[int, int] = {}
        """Datagrams dropped per uid, for the status file."""
        self._buckets: dict[int, tuple[float, float]] = {}

    def allow(self, uid: int) -> bool:
        """Whether ``uid`` may have one more datagram answered now (spends a token if so)."""
        now = self.clock()
        tokens, then = self._buckets.get(uid, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate_per_s)
        if len(self._buckets) >= MAX_TRACKED_UIDS and uid not in self._buckets:
            self._buckets.clear()  # uids are few on a node; this only bounds memory
        if tokens < 1.0:
            self._buckets[uid] = (tokens, now)
            self.dropped[uid] = self.dropped.get(uid, 0) + 1
            return False
        self._buckets[uid] = (tokens - 1.0, now)
        return True


class EndpointBusy(Exception):
    """Another process (a site's Dynolog, or a second agent) already serves the Kineto socket."""


@dataclass(frozen=True)
class Credentials:
    """Who sent a datagram, as the kernel vouches for it."""

    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class Served:
    """What one :meth:`KinetoEndpoint.serve_once` did.

    ``config`` is the config handed out (``None``: "no config" or a registration answered);
    ``error`` says why a datagram was dropped or its answer could not be sent.
    """

    creds: Credentials | None
    request: KinetoRequest | None
    config: str | None = None
    error: str | None = None


Decide = Callable[[KinetoRequest, Credentials], str | None]


class KinetoEndpoint:
    """The bound ``dynolog`` datagram socket. Not thread-safe: serve it from one thread.

    ``owner_uid``: the socket file is that user's, mode 0600 (only its processes may send), else
    0666. ``take_over``: a name already bound in ``socket_dir`` is replaced even when something
    answers there (the caller owns the directory's purpose: see :mod:`~jobsight.agent.node.kineto.sockets`), else
    :class:`EndpointBusy`. ``limit``: the per-uid rate limit shared by the caller's endpoints.
    """

    def __init__(self, name: str = DEFAULT_NAME, socket_dir: str | None = None, *, owner_uid: int | None = None,
                 take_over: bool = False, limit: UidRateLimit | None = None) -> None:
        self.path = _socket_path(name, socket_dir)
        self.address = f"@{name}" if self.path is None else self.path
        self.limit = limit
        self._name = name
        self._owner_uid = owner_uid
        self._take_over = take_over
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._inode = -1
        try:
            if socket_dir is None:
                self._bind_abstract(_abstract_address(name))
            else:
                self._bind_file(socket_dir)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise

    def serve_once(self, timeout: float, decide: Decide) -> Served | None:
        """Answer one datagram arriving within ``timeout`` seconds; ``None`` if none came.

        ``decide(request, creds)`` picks the config for a "req" (``None``: no config); a "ctxt"
        registration is acknowledged without it.
        """
        served = self._serve_one(decide)
        if served is None and timeout > 0 and self._wait_readable(timeout):
            served = self._serve_one(decide)
        return served

    def serve_ready(self, decide: Decide, most: int) -> list[Served]:
        """Answer up to ``most`` datagrams already queued, without waiting: a caller serving several
        endpoints takes turns, so a flooded one cannot hold the thread."""
        done: list[Served] = []
        while len(done) < most:
            served = self._serve_one(decide)
            if served is None:
                break
            done.append(served)
        return done

    def intact(self) -> bool:
        """Whether the socket file is still the one bound here (an abstract name always is)."""
        if self.path is None:
            return self._sock.fileno() >= 0
        try:
            return os.lstat(self.path).st_ino == self._inode
        except OSError:
            return False

    def _serve_one(self, decide: Decide) -> Served | None:
        try:
            data, ancillary, flags, sender = self._sock.recvmsg(MAX_DATAGRAM_BYTES, CREDENTIALS_SPACE)
        except (BlockingIOError, InterruptedError):
            return None
        creds = _credentials(ancillary)
        if creds is not None and self.limit is not None and not self.limit.allow(creds.uid):
            # Dropped before parsing or answering: a flood costs this read and nothing more.
            return Served(creds, None, error="rate limited")
        if flags & socket.MSG_TRUNC:
            return Served(creds, None, error=f"datagram longer than {MAX_DATAGRAM_BYTES} bytes dropped")
        if flags & socket.MSG_CTRUNC:
            # The sender attached more than credentials (file descriptors, which the kernel then
            # discards for want of room): Kineto never does that.
            return Served(creds, None, error="datagram with extra ancillary data dropped")
        if creds is None:
            return Served(None, None, error="datagram without sender credentials dropped")
        try:
            request = parse_datagram(data)
        except MalformedDatagram as exc:
            return Served(creds, None, error=f"malformed datagram from pid {creds.pid} dropped: {exc}")
        if not sender:
            return Served(creds, request, error=f"pid {creds.pid} sent from an unbound socket: cannot answer")
        if request.kind == CONTEXT:
            return Served(creds, request, error=self._reply(sender, encode_context_reply(REGISTERED_REPLY)))
        try:
            config = decide(request, creds) or None
            payload = encode_config_reply(config or "")
        except Exception as exc:  # noqa: BLE001 - boundary: a failing decision is "no config", never a stall
            # Answer at once so the process does not read a late reply as the one to its next poll.
            self._reply(sender, encode_config_reply(""))
            return Served(creds, request, error=f"decide failed, answered no config: {exc!r}")
        error = self._reply(sender, payload)
        return Served(creds, request, config=config if error is None else None, error=error)

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        """Release the name; a socket file is removed only if it is still the one bound here."""
        if self._sock.fileno() < 0:
            return
        self._sock.close()
        if self.path is not None:
            try:
                # lstat, unlink: neither follows a link, whoever owns the directory.
                if os.lstat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except OSError:
                pass

    def __enter__(self) -> KinetoEndpoint:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _busy(self, cause: OSError) -> EndpointBusy:
        return EndpointBusy(f"the Kineto socket {self.address} is already bound by another process "
                            f"(a Dynolog daemon or another jobsight agent): {cause.strerror}")

    def _bind_abstract(self, address: bytes) -> None:
        try:
            self._sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise self._busy(exc) from exc
            raise

    def _bind_file(self, socket_dir: str) -> None:
        assert self.path is not None
        dir_fd = os.open(socket_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for attempt in range(BIND_TRIES):
                try:
                    self._sock.bind(self.path)
                    break
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE or attempt == BIND_TRIES - 1:
                        raise
                    if not self._take_over and _is_served(self.path):
                        raise self._busy(exc) from exc
                    # A file left by a process that died (nobody reads it), or, with take_over,
                    # whatever the directory's owner put there: unlink never follows a link.
                    _unlink_at(dir_fd, self._name)
            self._inode = self._claim_file(dir_fd)
        finally:
            os.close(dir_fd)

    def _claim_file(self, dir_fd: int) -> int:
        """Give the freshly bound file its mode (and owner); returns its inode.

        The file is reached through an ``O_PATH`` descriptor checked to be a socket of this
        process's uid with one link: the directory's owner may have swapped the name for a link or
        hard-linked another root socket in, and those must not be chmod-ed (or given away)."""
        fd = os.open(self._name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            info = os.fstat(fd)
            if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
                raise OSError(errno.EEXIST, f"{self.path} was replaced before it could be set up")
            # /proc/self/fd/<fd> names exactly the inode checked above.
            magic = f"/proc/self/fd/{fd}"
            os.chmod(magic, SOCKET_FILE_MODE if self._owner_uid is None else OWNED_SOCKET_FILE_MODE)
            if self._owner_uid is not None:
                os.chown(magic, self._owner_uid, -1)
            return info.st_ino
        finally:
            os.close(fd)

    def _wait_readable(self, timeout: float) -> bool:
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))

    def _reply(self, sender: str | bytes, payload: bytes) -> str | None:
        try:
            self._sock.sendto(payload, socket.MSG_DONTWAIT, sender)
        except OSError as exc:
            # The client may have exited or stopped reading; its next poll asks again.
            return f"answer to {sender!r} not sent: {exc}"
        return None


def _socket_path(name: str, socket_dir: str | None) -> str | None:
    if not name or "/" in name or "\0" in name:
        raise ValueError(f"socket name {name!r} must be non-empty, without '/' or NUL")
    if socket_dir is None:
        if len(name.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"abstract socket name {name!r} is longer than {MAX_NAME_BYTES} bytes")
        return None
    path = os.path.join(socket_dir, name)
    if len(path.encode()) > MAX_NAME_BYTES + 1:
        raise ValueError(f"socket path {path!r} is longer than {MAX_NAME_BYTES + 1} bytes")
    return path


def _unlink_at(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _abstract_address(name: str) -> bytes:
    # Kineto's address length counts a trailing NUL, and abstract names match byte for byte.
    return b"\0" + name.encode() + b"\0"


def _is_served(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except OSError as exc:
        return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()
    return True


def _credentials(ancillary: list[tuple[int, int, bytes]]) -> Credentials | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= UCRED.size:
            pid, uid, gid = UCRED.unpack_from(data)
            return Credentials(pid, uid, gid)
    return None
