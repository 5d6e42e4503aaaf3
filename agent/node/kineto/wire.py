"""The datagrams PyTorch's profiler (Kineto) exchanges with a node-local daemon, and their replies.

A process started with ``KINETO_USE_DAEMON=1`` polls the daemon over a Unix datagram socket with the
message layout of Dynolog's "IPC fabric" (``dynolog/src/ipcfabric``). Every datagram is a fixed
40-byte header followed by a body; all integers are in the host's byte order, since both ends share
one machine::

    header   size_t size; char type[32]         "=Q32s"   size = body length, type NUL-terminated
    "req"    int type; int n; int64 jobid;      "=iiq"    then n x int32 pids: the process itself
             int32 pids[n]                                first, then its parent, grandparent, ...
    "ctxt"   int32 gpu; int32 pid; int64 jobid  "=iiq"

``jobid`` is ``SLURM_JOB_ID`` read as a number by the process (0 when unset). ``type`` in a "req"
is a bit mask: 1 (events) | 2 (activities); Kineto clears the activities bit while its profiler is
busy, and a trace config sent then is dropped, so callers should only hand one out when it is set.

The daemon answers each message to the sender's own address:

* "req": header with type "req" and the config text as body, no terminating NUL; an empty body
  means "no config" (Dynolog's answer, and what Kineto reads as nothing to do).
* "ctxt": header with type "ctxt" and one int32 body (Dynolog: processes known for the job).

This module only converts bytes; it trusts nothing it parses. A datagram that does not follow the
layout raises :class:`MalformedDatagram` so a daemon can drop it and carry on.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, Literal

MessageKind = Literal["req", "ctxt"]

REQUEST: Final = "req"
CONTEXT: Final = "ctxt"

HEADER: Final = struct.Struct("=Q32s")
REQUEST_FIXED: Final = struct.Struct("=iiq")
CONTEXT_BODY: Final = struct.Struct("=iiq")
PID: Final = struct.Struct("=i")
TYPE_FIELD_BYTES: Final = 32

CONFIG_TYPE_EVENTS: Final = 0x1
CONFIG_TYPE_ACTIVITIES: Final = 0x2

MAX_PIDS: Final = 64
"""Kineto sends the process and at most 10 ancestors; anything far beyond that is not Kineto."""
MAX_CONFIG_BYTES: Final = 16 * 1024
"""A profiling config is a few short ``KEY=value`` lines; the cap keeps a reply one small datagram."""
MAX_DATAGRAM_BYTES: Final = HEADER.size + REQUEST_FIXED.size + MAX_PIDS * PID.size


class MalformedDatagram(ValueError):
    """A datagram that does not follow the Kineto/Dynolog layout."""


@dataclass(frozen=True)
class KinetoRequest:
    """One parsed message from a Kineto client.

    ``pids`` starts with the sending process and walks up its ancestors ("req"); a "ctxt" carries
    just the process's own pid. ``config_type`` (bit mask) is set for "req" only, ``gpu`` for
    "ctxt" only.
    """

    kind: MessageKind
    job_id: int
    pids: tuple[int, ...]
    config_type: int = 0
    gpu: int = -1

    @property
    def wants_activities(self) -> bool:
        """Whether the process would accept a trace config now (its profiler is idle)."""
        return bool(self.config_type & CONFIG_TYPE_ACTIVITIES)


def parse_datagram(data: bytes) -> KinetoRequest:
    """The message in one received datagram; :class:`MalformedDatagram` if it is not one."""
    kind, body = _split_header(data)
    if kind == REQUEST:
        return _parse_request(body)
    return _parse_context(body)


def encode_config_reply(config: str) -> bytes:
    """The answer to a "req": ``config`` as the body, ``""`` meaning "no config"."""
    body = config.encode("utf-8")
    if len(body) > MAX_CONFIG_BYTES:
        raise ValueError(f"config of {len(body)} bytes exceeds {MAX_CONFIG_BYTES}")
    return _header(REQUEST, len(body)) + body


def encode_context_reply(count: int) -> bytes:
    """The answer to a "ctxt" registration: one int32, as Dynolog sends."""
    return _header(CONTEXT, PID.size) + PID.pack(count)


def encode_request(job_id: int, pids: tuple[int, ...], config_type: int = CONFIG_TYPE_ACTIVITIES) -> bytes:
    """A "req" as Kineto sends it: for tests and probes that play the client's part."""
    body = REQUEST_FIXED.pack(config_type, len(pids), job_id) + b"".join(PID.pack(pid) for pid in pids)
    return _header(REQUEST, len(body)) + body


def encode_context(job_id: int, pid: int, gpu: int = -1) -> bytes:
    """A "ctxt" as Kineto's ``registerInstance`` sends it: for tests and probes."""
    return _header(CONTEXT, CONTEXT_BODY.size) + CONTEXT_BODY.pack(gpu, pid, job_id)


def _header(kind: MessageKind, size: int) -> bytes:
    # struct pads the 32-byte field with NULs, which is the C string's terminator.
    return HEADER.pack(size, kind.encode("ascii"))


def _split_header(data: bytes) -> tuple[MessageKind, bytes]:
    if len(data) < HEADER.size:
        raise MalformedDatagram(f"datagram of {len(data)} bytes is shorter than the {HEADER.size}-byte header")
    size, raw_type = HEADER.unpack_from(data)
    body = data[HEADER.size:]
    if size != len(body):
        raise MalformedDatagram(f"header says {size} body bytes, datagram carries {len(body)}")
    if b"\0" not in raw_type:
        raise MalformedDatagram("message type is not NUL-terminated")
    name = raw_type.split(b"\0", 1)[0]
    if name == b"req":
        return "req", body
    if name == b"ctxt":
        return "ctxt", body
    raise MalformedDatagram(f"unknown message type {name[:TYPE_FIELD_BYTES]!r}")


def _parse_request(body: bytes) -> KinetoRequest:
    if len(body) < REQUEST_FIXED.size:
        raise MalformedDatagram(f"request body of {len(body)} bytes is shorter than {REQUEST_FIXED.size}")
    config_type, count, job_id = REQUEST_FIXED.unpack_from(body)
    if not 1 <= count <= MAX_PIDS:
        raise MalformedDatagram(f"request names {count} pids, expected 1 to {MAX_PIDS}")
    expected = REQUEST_FIXED.size + count * PID.size
    if len(body) != expected:
        raise MalformedDatagram(f"request with {count} pids must be {expected} bytes, is {len(body)}")
    pids = tuple(pid for (pid,) in PID.iter_unpack(body[REQUEST_FIXED.size:]))
    if any(pid <= 0 for pid in pids):
        raise MalformedDatagram(f"request carries a non-positive pid: {pids}")
    return KinetoRequest("req", job_id, pids, config_type=config_type)


def _parse_context(body: bytes) -> KinetoRequest:
    if len(body) != CONTEXT_BODY.size:
        raise MalformedDatagram(f"context body must be {CONTEXT_BODY.size} bytes, is {len(body)}")
    gpu, pid, job_id = CONTEXT_BODY.unpack(body)
    if pid <= 0:
        raise MalformedDatagram(f"context carries a non-positive pid: {pid}")
    return KinetoRequest("ctxt", job_id, (pid,), gpu=gpu)
