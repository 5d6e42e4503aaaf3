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
caller steps aside. Hostile or broken datagrams are dropped and reported, never raised.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Final

from jobsight.agent.node.kineto_wire import (
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
"""Any user's training process must be able to send to a socket file, as Dynolog allows."""
REGISTERED_REPLY: Final = 1
"""Answer to a "ctxt" registration; Kineto only checks that one arrives."""


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
    """The bound ``dynolog`` datagram socket. Not thread-safe: serve it from one thread."""

    def __init__(self, name: str = DEFAULT_NAME, socket_dir: str | None = None) -> None:
        self.path = _socket_path(name, socket_dir)
        self.address = f"@{name}" if self.path is None else self.path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._inode = -1
        try:
            self._bind(_abstract_address(name) if self.path is None else self.path)
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
        if not self._wait_readable(timeout):
            return None
        try:
            data, ancillary, flags, sender = self._sock.recvmsg(MAX_DATAGRAM_BYTES, CREDENTIALS_SPACE)
        except (BlockingIOError, InterruptedError):
            return None
        creds = _credentials(ancillary)
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
        except Exception:
            # Answer anyway so the process does not read a late reply as the one to its next poll.
            self._reply(sender, encode_config_reply(""))
            raise
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
                if os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> KinetoEndpoint:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _bind(self, address: str | bytes) -> None:
        try:
            self._sock.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if self.path is None or _is_served(self.path):
                raise EndpointBusy(f"the Kineto socket {self.address} is already bound by another process "
                                   "(a Dynolog daemon or another jobsight agent)") from exc
            # A file left by a process that died: nobody reads it, so it is safe to take over.
            os.unlink(self.path)
            self._sock.bind(address)
        if self.path is not None:
            os.chmod(self.path, SOCKET_FILE_MODE)
            self._inode = os.stat(self.path).st_ino

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
